"""`servegraph status`'s tree, drawn from what the API server and Ray Serve return
(the same command against a real cluster is in tests/node/test_observability.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from builders import deployment, graph
from google.protobuf import text_format
from support import SAMPLES

from servegraph.graph import load_graph
from servegraph.graph.validate import to_model
from servegraph.render import serve_config_yaml
from servegraph.statustree.tree import Snapshot, age, render
from servegraph.v1 import graph_pb2

NOW = datetime(2026, 11, 23, 10, 5, 0, tzinfo=UTC)
DIGEST = "sha256:" + "ab" * 32


def condition(kind: str, status: str, reason: str, message: str, at: str) -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": at}


def observed_servegraph() -> dict[str, Any]:
    healthy = {"status": "HEALTHY"}
    return {
        "metadata": {"name": "observed", "namespace": "team-a"},
        "status": {
            "graph": {"name": "observed", "version": "1", "digest": DIGEST, "applications": 2, "nodes": 9},
            "rayServiceName": "observed",
            "conditions": [
                condition("Fetched", "True", "Downloaded", "downloaded 1234 bytes", "2026-11-23T10:00:00Z"),
                condition("GraphValid", "True", "Valid", "graph observed version '1'", "2026-11-23T10:00:00Z"),
                condition("Applied", "True", "UpToDate", "RayService observed matches", "2026-11-23T10:00:01Z"),
                condition("Ready", "False", "ApplicationsNotRunning", "strict: DEPLOYING", "2026-11-23T10:04:00Z"),
            ],
            "applications": {
                "review": {
                    "status": "RUNNING",
                    "deployments": {
                        n: healthy for n in ("pipeline", "panel", "lexicon", "tokenizer", "second-opinion", "audit")
                    },
                },
                "strict": {
                    "status": "DEPLOYING",
                    "deployments": {
                        "quorum": healthy,
                        "quick": healthy,
                        "laggard": {"status": "UPDATING", "message": "Deploying:\n  waiting for replicas"},
                    },
                },
            },
        },
    }


def rayservice(config: str) -> dict[str, Any]:
    return {"spec": {"serveConfigV2": config}, "status": {"activeServiceStatus": {"rayClusterName": "observed-x7k2p"}}}


EVENTS = [
    {
        "reason": "Applied",
        "message": "created RayService observed: graph observed version '1'",
        "lastTimestamp": "2026-11-23T10:00:01Z",
    },
    {"reason": "Applied", "message": "an older one", "lastTimestamp": "2026-11-22T10:00:01Z"},
    {"reason": "FetchFailed", "message": "a later warning", "lastTimestamp": "2026-11-23T10:03:00Z"},
]


def running(n: int, target: int) -> dict[str, Any]:
    return {
        "replicas": [{"state": "RUNNING"}] * n + [{"state": "STARTING"}] * (target - n),
        "target_num_replicas": target,
    }


SERVE = {
    "applications": {
        "review": {
            "deployments": {
                "pipeline": running(1, 1),
                "panel": running(1, 2),
                **{n: running(1, 1) for n in ("lexicon", "tokenizer", "second-opinion", "audit")},
            }
        }
    }
}

EXPECTED = """\
Name:          observed
Namespace:     team-a
Ready:         False  ApplicationsNotRunning  (since 1m)  strict: DEPLOYING
Graph:         observed  version '1'  sha256:abababababababababababababababababababababababababababababababab  (2 applications, 9 nodes)
RayService:    observed  (Ray cluster observed-x7k2p)
Last rollout:  4m ago: created RayService observed: graph observed version '1'
Conditions:
  TYPE        STATUS  REASON                  AGE  MESSAGE
  Fetched     True    Downloaded              5m   downloaded 1234 bytes
  GraphValid  True    Valid                   5m   graph observed version '1'
  Applied     True    UpToDate                4m   RayService observed matches
  Ready       False   ApplicationsNotRunning  1m   strict: DEPLOYING
Graph as deployed:
review  /review  RUNNING
  NODE                                                    KIND                           STATE    REPLICAS
  pipeline                                                sequence                       HEALTHY  1/1 running
  ├─ panel [step 1] (timeout 10s)                         ensemble                       HEALTHY  1/2 running
  │  ├─ lexicon [member] (timeout 5s, retries 1)          servegraph.examples:Sentiment  HEALTHY  1/1 running
  │  │  └─ tokenizer (handle)                             servegraph.examples:Tokenizer  HEALTHY  1/1 running
  │  └─ second-opinion [member] (timeout 0.5s, optional)  servegraph.examples:Slow       HEALTHY  1/1 running
  └─ audit [step 2]                                       servegraph.examples:Echo       HEALTHY  1/1 running
strict  /strict  DEPLOYING
  NODE                                KIND                      STATE     REPLICAS
  quorum                              ensemble                  HEALTHY   want 1
  ├─ quick [member]                   servegraph.examples:Echo  HEALTHY   want 1
  └─ laggard [member] (timeout 0.5s)  servegraph.examples:Slow  UPDATING  want 1
      ! Deploying: waiting for replicas
"""


def test_the_observed_sample_as_a_tree_with_live_replicas_and_the_last_rollout() -> None:
    config = serve_config_yaml(load_graph(SAMPLES / "observed.txtpb"))
    assert render(Snapshot(observed_servegraph(), rayservice(config), EVENTS, SERVE), NOW) == EXPECTED


def test_without_ray_serve_the_tree_says_what_the_config_asks_for_and_why() -> None:
    config = serve_config_yaml(load_graph(SAMPLES / "observed.txtpb"))
    note = "the API server's service proxy answered 403 Forbidden"
    text = render(Snapshot(observed_servegraph(), rayservice(config), EVENTS, None, note), NOW)
    assert f"  (replicas: what the config asks for; live counts unavailable: {note})\n" in text
    assert (
        "  pipeline                                                sequence                       HEALTHY  want 1\n"
        in text
    )


def test_switch_and_splitter_edges_autoscaling_and_a_shared_node() -> None:
    app = graph_pb2.Application(name="app", route_prefix="/app", ingress="split")
    app.nodes["a"].CopyFrom(deployment("pkg.mod:A"))
    app.nodes["b"].CopyFrom(deployment("pkg.mod:B"))
    app.nodes["b"].scaling.autoscaling.min_replicas = 1
    app.nodes["b"].scaling.autoscaling.max_replicas = 4
    sw = app.nodes["sw"].switch
    sw.header = "X-Kind"
    sw.cases.add(equals="x", node=graph_pb2.NodeRef(id="a", retries=2))
    sw.default.id = "b"
    app.nodes["split"].splitter.routes.add(node=graph_pb2.NodeRef(id="sw"), weight=90)
    app.nodes["split"].splitter.routes.add(node=graph_pb2.NodeRef(id="a"), weight=10)
    config = serve_config_yaml(to_model(graph(app)))
    sg = {"metadata": {"name": "g", "namespace": "ns"}, "status": {"rayServiceName": "g"}}
    text = render(Snapshot(sg, {"spec": {"serveConfigV2": config}}), NOW)
    assert text.endswith(
        "Conditions:\n"
        "  none yet\n"
        "Graph as deployed:\n"
        "app  /app  NOT REPORTED\n"
        "  NODE                         KIND                     STATE  REPLICAS\n"
        "  split                        splitter 90/10                  want 1\n"
        "  ├─ sw [90%]                  switch on header x-kind         want 1\n"
        "  │  ├─ a [= 'x'] (retries 2)  pkg.mod:A                       want 1\n"
        "  │  └─ b [default]            pkg.mod:B                       want 1..4\n"
        "  └─ a [10%]                   pkg.mod:A                                  (shown above)\n"
    ), text
    assert "Last rollout:  none recorded" in text
    assert "Graph:         none applied yet" in text


def test_no_rayservice_yet() -> None:
    sg = {"metadata": {"name": "g", "namespace": "ns"}, "status": {}}
    assert render(Snapshot(sg), NOW).endswith("Graph as deployed:\n  no RayService (or no serveConfigV2) yet\n")


def test_ages_read_like_kubectls() -> None:
    assert [age(t, NOW) for t in ("2026-11-23T10:04:58Z", "2026-11-23T10:03:30Z", "2026-11-23T07:00:00Z")] == [
        "2s",
        "1m",
        "3h",
    ]
    assert age("2026-11-20T10:05:00Z", NOW) == "3d"
    assert age(None, NOW) == age("garbage", NOW) == "?"


def test_the_rollout_and_the_history_from_the_status() -> None:
    sg = {
        "metadata": {"name": "g", "namespace": "ns"},
        "status": {
            "rollout": {
                "version": "1",
                "digest": "a" * 64,
                "phase": "Serving",
                "cause": "rollback",
                "from": "b" * 64,
                "startedAt": "2026-11-23T10:03:00Z",
                "readyAt": "2026-11-23T10:04:00Z",
            },
            "history": [
                {
                    "version": "1",
                    "digest": "a" * 64,
                    "outcome": "Serving",
                    "appliedAt": "2026-11-23T10:03:00Z",
                    "readyAt": "2026-11-23T10:04:00Z",
                },
                {
                    "version": "2",
                    "digest": "b" * 64,
                    "outcome": "RolledBack",
                    "appliedAt": "2026-11-23T10:01:00Z",
                    "message": "ApplicationFailed: app: DEPLOY_FAILED",
                },
            ],
        },
    }
    text = render(Snapshot(sg), NOW)
    assert "Rollout:       version '1' Serving (rolling back from bbbbbbbbbbbb), started 2m ago, Ready 1m ago\n" in text
    assert "Last rollout" not in text, "the status says it: no need for Events"
    assert (
        "History:\n"
        "  VERSION  OUTCOME     DIGEST        APPLIED  READY  MESSAGE\n"
        "  '1'      Serving     aaaaaaaaaaaa  2m       1m\n"
        "  '2'      RolledBack  bbbbbbbbbbbb  4m       -      ApplicationFailed: app: DEPLOY_FAILED\n"
    ) in text, text


def test_an_incremental_upgrade_shows_each_clusters_share_and_a_rolled_back_cluster_its_version() -> None:
    upgrade = {
        "activeRayCluster": "g-a",
        "pendingRayCluster": "g-b",
        "applications": {"app": "RUNNING"},
        "incremental": {
            "active": {"trafficRoutedPercent": 75, "targetCapacity": 100},
            "pending": {
                "trafficRoutedPercent": 25,
                "targetCapacity": 50,
                "lastTrafficMigratedTime": "2026-11-23T10:04:50Z",
            },
        },
    }
    history = [
        {"version": "1", "digest": "a" * 64, "outcome": "Progressing", "appliedAt": "2026-11-23T10:03:00Z"},
        {
            "version": "2",
            "digest": "b" * 64,
            "outcome": "RolledBack",
            "appliedAt": "2026-11-23T10:01:00Z",
            "rayCluster": {"name": "g-b", "outcome": "RolledBack", "peakTrafficPercent": 25},
            "message": "ApplicationFailed: app: DEPLOY_FAILED",
        },
    ]
    sg = {"metadata": {"name": "g", "namespace": "ns"}, "status": {"upgrade": upgrade, "history": history}}
    text = render(Snapshot(sg), NOW)
    assert (
        "Upgrade:       Ray cluster g-b (app: RUNNING); incremental, from g-a\n"
        "  g-b: 25 % of requests, target capacity 50 %, moved 2026-11-23T10:04:50Z\n"
        "  g-a: 75 % of requests, target capacity 100 %\n"
    ) in text, text
    back = render(Snapshot({**sg, "status": {"upgrade": {**upgrade, "rollingBack": True}}}), NOW)
    assert "Upgrade:       Ray cluster g-b (app: RUNNING); rolling back to g-a\n" in back
    assert (
        "'2'      RolledBack   bbbbbbbbbbbb  4m       -      Ray cluster g-b rolled back at 25 %: ApplicationFailed"
        in text
    )


def pod(name: str, role: str, phase: str, group: str = "", **status: Any) -> dict[str, Any]:
    labels = {"ray.io/cluster": "mini-x7k2p", "ray.io/node-type": role}
    if group:
        labels["ray.io/group"] = group
    return {"metadata": {"name": name, "labels": labels}, "status": {"phase": phase, **status}}


UNSCHEDULED = (
    "Deployment 'tokenizer' in application 'sentiment' has 1 replicas that have taken more than 30s to be "
    'scheduled. Resources required for each replica: {"CPU": 0.1}, total resources available: {}.'
)
STUCK_PODS = [
    pod("mini-x7k2p-head-h8s9d", "head", "Running", containerStatuses=[{"name": "ray-head", "state": {"running": {}}}]),
    pod(
        "mini-x7k2p-cpu-worker-b2x4k",
        "worker",
        "Pending",
        "cpu",
        conditions=[
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: "
                "1 No preemption victims found for incoming pod.",
            }
        ],
    ),
    pod(
        "mini-x7k2p-cpu-worker-a1q7z",
        "worker",
        "Pending",
        "cpu",
        conditions=[{"type": "PodScheduled", "status": "True"}],
        containerStatuses=[
            {
                "name": "ray-worker",
                "state": {
                    "waiting": {
                        "reason": "ImagePullBackOff",
                        "message": 'Back-off pulling image "registry.example/ray:missing"',
                    }
                },
            }
        ],
    ),
    pod(
        "mini-x7k2p-gpu-worker-c3v5n",
        "worker",
        "Running",
        "gpu",
        containerStatuses=[
            {
                "name": "ray-worker",
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed"}},
                "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
            }
        ],
    ),
    pod("mini-x7k2p-gpu-worker-d4w6m", "worker", "Pending", "gpu"),
]


def stuck_servegraph() -> dict[str, Any]:
    sg = observed_servegraph()
    status = sg["status"]
    del status["applications"]
    status["conditions"][3] = condition(
        "Ready",
        "False",
        "ApplicationsNotRunning",
        f'KubeRay is starting Ray cluster mini-x7k2p: application "sentiment": deployment "tokenizer": {UNSCHEDULED}; '
        "sentiment: DEPLOYING",
        "2026-11-23T10:04:00Z",
    )
    status["pending"] = {
        "rayClusterName": "mini-x7k2p",
        "applications": {
            "sentiment": {
                "status": "DEPLOYING",
                "deployments": {
                    "sentiment": {"status": "UPDATING"},
                    "tokenizer": {"status": "UPDATING", "message": UNSCHEDULED},
                },
            }
        },
    }
    return sg


def raycluster(name: str, *conditions: dict[str, str], desired: int = 3, ready: int = 0) -> dict[str, Any]:
    """A RayCluster as KubeRay v1.6 keeps its status (counts of 0 omitted)."""
    status: dict[str, Any] = {"desiredWorkerReplicas": desired, "conditions": list(conditions)}
    if ready:
        status["readyWorkerReplicas"] = ready
    return {"metadata": {"name": name}, "status": status}


HEAD_READY = {"type": "HeadPodReady", "status": "True", "reason": "HeadPodRunningAndReady"}


def test_a_stuck_first_rollout_shows_the_starting_cluster_its_messages_and_the_pods_not_running() -> None:
    config = serve_config_yaml(load_graph(SAMPLES / "mini.txtpb"))
    rs = {"spec": {"serveConfigV2": config}, "status": {"pendingServiceStatus": {"rayClusterName": "mini-x7k2p"}}}
    clusters = [raycluster("mini-x7k2p", HEAD_READY)]
    snap = Snapshot(
        stuck_servegraph(), rs, serve=None, serve_note="no RayService", rayclusters=clusters, pods=STUCK_PODS
    )
    text = render(snap, NOW)
    assert "Starting:      Ray cluster mini-x7k2p (head pod ready, 0 of 3 workers ready), not serving yet\n" in text
    assert (
        "Ray pods not running:\n"
        "  mini-x7k2p-cpu-worker-a1q7z (worker cpu)  Pending  container ray-worker: ImagePullBackOff: "
        'Back-off pulling image "registry.example/ray:missing"\n'
        "  mini-x7k2p-cpu-worker-b2x4k (worker cpu)  Pending  not scheduled: Unschedulable: 0/1 nodes are "
        "available: 1 Insufficient cpu. preemption: 0/1 nodes are available: 1 No preemption victims found for "
        "incoming pod.\n"
        "  mini-x7k2p-gpu-worker-c3v5n (worker gpu)  Running  container ray-worker: CrashLoopBackOff: back-off 40s "
        "restarting failed (last run: OOMKilled, exit code 137)\n"
        "  mini-x7k2p-gpu-worker-d4w6m (worker gpu)  Pending  no scheduling decision yet\n"
        "Graph as deployed:\n"
    ) in text, text
    assert "mini-x7k2p-head" not in text, "a running pod is not listed"
    # The tree shows the starting cluster's states, and Ray's message in full enough to read the resources.
    assert "sentiment  /sentiment  DEPLOYING  (on Ray cluster mini-x7k2p, starting)\n" in text
    note = next(line for line in text.splitlines() if line.strip().startswith("! Deployment 'tokenizer'"))
    assert note.endswith("total resources available: {}."), note
    assert f'deployment "tokenizer": {UNSCHEDULED}; sentiment: DEPLOYING' in text, "the Ready message in full"


def test_a_pod_kuberay_could_not_create_is_named_under_its_cluster() -> None:
    sg = stuck_servegraph()
    failure = {
        "type": "RayClusterReplicaFailure",
        "status": "True",
        "reason": "FailedCreateWorkerPod",
        "message": 'pods "mini-x7k2p-cpu-worker-q2" is forbidden: exceeded quota: compute, requested: cpu=4',
    }
    text = render(Snapshot(sg, rayclusters=[raycluster("mini-x7k2p", HEAD_READY, failure, ready=1)]), NOW)
    assert (
        "Starting:      Ray cluster mini-x7k2p (head pod ready, 1 of 3 workers ready), not serving yet\n"
        '               ! FailedCreateWorkerPod: pods "mini-x7k2p-cpu-worker-q2" is forbidden: exceeded quota: '
        "compute, requested: cpu=4\n"
    ) in text
    # The same for the active cluster, under the RayService; without the RayCluster, just its name.
    del sg["status"]["pending"]
    rs = {"status": {"activeServiceStatus": {"rayClusterName": "mini-a"}}}
    text = render(Snapshot(sg, rs, rayclusters=[raycluster("mini-a", HEAD_READY, failure)]), NOW)
    assert "RayService:    observed  (Ray cluster mini-a)\n               ! FailedCreateWorkerPod: pods " in text
    assert "Starting:" not in text
    text = render(Snapshot(stuck_servegraph()), NOW)
    assert "Starting:      Ray cluster mini-x7k2p, not serving yet\nConditions:" in text


def test_pods_the_caller_may_not_list_are_said_so_and_many_pods_are_bounded() -> None:
    sg = {"metadata": {"name": "g", "namespace": "ns"}, "status": {}}
    text = render(Snapshot(sg, ray_note="the API server answered 403 Forbidden"), NOW)
    assert "Ray pods:      not read: the API server answered 403 Forbidden\n" in text
    many = [pod(f"w-{i:03}", "worker", "Pending", "cpu") for i in range(45)]
    text = render(Snapshot(sg, pods=many), NOW)
    assert "  w-019 (worker cpu)  Pending  no scheduling decision yet\n  … and 25 more\n" in text
    assert "w-020" not in text


def test_the_streaming_sample_marks_every_node_whose_output_streams() -> None:
    config = serve_config_yaml(load_graph(SAMPLES / "streaming.txtpb"))
    sg = {"metadata": {"name": "streaming", "namespace": "ns"}, "status": {"rayServiceName": "streaming"}}
    text = render(Snapshot(sg, {"spec": {"serveConfigV2": config}}), NOW)
    kinds = [line[46:92].strip() for line in text.split("Graph as deployed:\n", 1)[1].splitlines()[2:]]
    assert kinds == [
        "sequence (streams)",
        "servegraph.examples:Guard",  # the unary step before the stream
        "switch on header x-model (streams)",
        "servegraph.examples:TokenGenerator (streams)",
        "splitter 90/10 (streams)",
        "servegraph.examples:TokenGenerator (streams)",
        "servegraph.examples:TokenGenerator (streams)",  # gen-b again, shown above
        "servegraph.examples:StreamFilter (streams)",
    ], text


def test_a_weighted_canary_shows_its_step_and_the_evidence_node_by_node() -> None:
    sg = {
        "metadata": {"name": "g", "namespace": "ns"},
        "status": {
            "rollout": {
                "version": "2",
                "digest": "a" * 64,
                "phase": "Applied",
                "startedAt": "2026-11-23T10:03:00Z",
                "canary": {
                    "phase": "Weighted",
                    "step": 2,
                    "steps": 3,
                    "weight": 50,
                    "liveVersion": "1",
                    "stepStartedAt": "2026-11-23T10:04:00Z",
                    "message": "holding: 12 requests of the 100 the check needs",
                    "evidence": {
                        "at": "2026-11-23T10:04:30Z",
                        "source": "routers",
                        "verdict": "hold",
                        "reason": "too few requests: 12 < 100",
                        "canary": {"requests": 12, "errors": 1, "errorRate": 0.0833, "p99Ms": 40.0},
                        "live": {"requests": 1200, "errors": 0, "errorRate": 0.0},
                        "nodes": [
                            {
                                "application": "review",
                                "node": "panel",
                                "requests": 12,
                                "errors": 1,
                                "errorRate": 0.0833,
                                "p99Ms": 40.0,
                                "liveP99Ms": 20.0,
                            },
                        ],
                    },
                },
            },
        },
    }
    text = render(Snapshot(sg), NOW)
    assert "Canary:        Weighted: step 2 of 3: 50 % of requests beside '1' (since 1m)\n" in text, text
    assert "  last check hold 30s ago (routers): too few requests: 12 < 100\n" in text, text
    assert "    canary:   12 requests, 1 failed (8.33 %), p99 40 ms\n" in text, text
    assert "    live:     1,200 requests, 0 failed (0 %)\n" in text, text
    assert "    node review/panel: 12 requests, 1 failed (8.33 %), p99 40 ms (live p99 20 ms)\n" in text, text
    assert "  holding: 12 requests of the 100 the check needs\n" in text, text


def test_an_ended_canary_says_why_and_no_canary_says_nothing() -> None:
    aborted = {"phase": "Aborted", "version": "3", "message": "review/panel failed 10 % of 200 requests (limit 1 %)"}
    sg = {"metadata": {"name": "g", "namespace": "ns"}, "status": {"rollout": {"version": "2", "canary": aborted}}}
    text = render(Snapshot(sg), NOW)
    # status.rollout is the version rolled back to; the canary names the version it tried
    assert "Canary:        Aborted: version '3': review/panel failed 10 % of 200 requests (limit 1 %)\n" in text, text
    plain = {"metadata": {"name": "g", "namespace": "ns"}, "status": {"rollout": {"version": "2"}}}
    assert "Canary:" not in render(Snapshot(plain), NOW)


def test_a_canarys_side_application_lists_its_copies_not_an_unreadable_graph() -> None:
    from servegraph.render import canary as layouts
    from servegraph.render.serve_config import config_yaml, render_serve_config

    text = (SAMPLES / "observed.txtpb").read_text()
    slower = text.replace('version: "1"', 'version: "2"').replace("number_value: 2 ", "number_value: 3 ")
    assert slower != text
    v1 = layouts.ready(render_serve_config(load_graph(SAMPLES / "observed.txtpb")))
    v2 = layouts.ready(render_serve_config(to_model(text_format.Parse(slower, graph_pb2.Graph()))))
    config = config_yaml(layouts.layout(v1, None, v2, layouts.Split(weight=10)))
    sg = {"metadata": {"name": "observed", "namespace": "ns"}, "status": {}}
    tree = render(Snapshot(sg, rayservice(config)), NOW)
    assert "cannot read" not in tree, tree
    lines = tree.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("review~"))
    assert lines[at + 1] == "  copies of application review's nodes, as a canary's version has them:", tree
    assert lines[at + 2].split() == ["NODE", "KIND", "STATE", "REPLICAS"], tree
    assert lines[at + 3].split()[0] == "second-opinion" and "want 1" in lines[at + 3], tree
