"""The operator drives a canary (issue 46), on the in-memory API: steps, evidence, promote,
abort, refusals, a leader change, a publish meanwhile, promote by hand.

KubeRay is played by the test (`report_running`: every application of the applied Serve
config RUNNING); the evidence by a reader the test controls. What no unit test can show —
real replicas, real traffic split, real Prometheus — tests/node/test_canary.py does.
"""

from __future__ import annotations

import copy
from typing import Any

import yaml
from google.protobuf import text_format
from reconcile_support import KEY, NAME, NS, Cluster

from servegraph.evidence import Counts, Evidence, NodeCounts, Request
from servegraph.names import CANARY_ANNOTATION
from servegraph.operator.metrics import Metrics
from servegraph.operator.reconcile import Reconciler
from servegraph.operator.rollout.decide import STABLE_S
from servegraph.render.canary import side_app
from servegraph.v1 import graph_pb2

GRAPH = """
name: "flow"
version: "VERSION"
schema_version: 1
applications {
  name: "svc"
  route_prefix: "/svc"
  ingress: "front"
  nodes { key: "front" value { sequence { steps { id: "model" } } resources { num_cpus: 0.1 } } }
  nodes { key: "model" value { deployment { import_path: "servegraph.examples:Echo" args { value { string_value: "TAG" } } } resources { num_cpus: 0.1 } } }
}
"""
CANARY = {"steps": [{"weight": 10, "pause": "30s"}, {"weight": 50, "pause": "30s"}], "analysis": {"minRequests": 20}}


def graph(version: str, tag: str | None = None, ingress_user_code: bool = False) -> bytes:
    g = text_format.Parse(GRAPH.replace("VERSION", version).replace("TAG", tag or f"v{version}"), graph_pb2.Graph())
    if ingress_user_code:
        g.applications[0].ingress = "model"
        del g.applications[0].nodes["front"]
    return g.SerializeToString()


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


class Reader:
    """Evidence as the test says; what was asked, recorded."""

    def __init__(self) -> None:
        self.evidence: Evidence | None = None
        self.asked: list[Request] = []

    async def read_canary(self, request: Request) -> Evidence:
        self.asked.append(request)
        assert self.evidence is not None
        return self.evidence


GOOD = Evidence(
    "prometheus",
    Counts(100, 0, 30.0),
    Counts(900, 0, 30.0),
    nodes=(NodeCounts("svc", "model", Counts(100, 0, 30.0), 30.0),),
)
FAILING = Evidence(
    "prometheus",
    Counts(100, 10, 30.0),
    Counts(900, 0, 30.0),
    nodes=(NodeCounts("svc", "model", Counts(100, 10, 30.0), 30.0),),
)


def canaried(**spec: Any) -> tuple[Cluster, Clock, Reader]:
    c = Cluster()
    clock, reader = Clock(), Reader()
    c.reconciler = Reconciler(c.api, c.registry, Metrics(), c.queue, wall=clock, evidence=reader)
    c.body["spec"]["rollout"] = {"canary": spec or CANARY}
    return c, clock, reader


def serve_config(c: Cluster) -> dict[str, Any]:
    return yaml.safe_load(c.api.rayservices[KEY]["spec"]["serveConfigV2"])


def apps(c: Cluster) -> dict[str, dict[str, Any]]:
    return {a["name"]: a for a in serve_config(c)["applications"]}


async def report_running(c: Cluster, clock: Clock, seconds: float = 1.0) -> None:
    """KubeRay acted on the spec: every application of its Serve config RUNNING; the operator sees it."""
    c.api.kuberay_reports(NS, NAME, **dict.fromkeys(apps(c), "RUNNING"))
    clock.now += seconds
    c.watch_rayservice()
    await c.reconcile()
    c.watch_servegraph()


async def serving_v1(c: Cluster, clock: Clock) -> None:
    c.publish(graph("1"))
    await c.started()
    for _ in range(2):
        await report_running(c, clock, STABLE_S)
    assert c.body["status"]["rollout"]["phase"] == "Serving"
    assert c.body["status"]["layout"] == {"base": c.body["status"]["rollout"]["digest"]} | {
        "live": c.body["status"]["rollout"]["digest"]
    }


def canary_state(c: Cluster) -> dict[str, Any]:
    return dict(c.body["status"]["rollout"].get("canary") or {})


def events(c: Cluster) -> list[str]:
    return [reason for _, reason, _ in c.api.events]


async def test_a_good_version_is_canaried_step_by_step_and_promoted_without_touching_the_base() -> None:
    c, clock, reader = canaried()
    await serving_v1(c, clock)
    base_args = apps(c)["svc"]["args"]
    c.publish(graph("2"))
    await c.reconcile()
    assert canary_state(c)["phase"] == "Deploying" and canary_state(c)["weight"] == 0
    sides = [n for n in apps(c) if side_app(n)]
    assert len(sides) == 1 and apps(c)["svc"]["args"] == base_args, "the base was rebuilt for the canary"
    assert [d["name"] for d in apps(c)[sides[0]]["deployments"]] == ["model"], "only the changed node is copied"

    reader.evidence = GOOD
    await report_running(c, clock)  # the copies run: step 1
    assert (canary_state(c)["phase"], canary_state(c)["step"], canary_state(c)["weight"]) == ("Weighted", 1, 10)
    assert c.condition("Progressing") == ("True", "Canary")
    progressing = next(x for x in c.body["status"]["conditions"] if x["type"] == "Progressing")["message"]
    assert "step 1 of 2: 10 % of requests" in progressing and "beside '1'" in progressing
    front = next(d for d in apps(c)["svc"]["deployments"] if d["name"] == "front")
    assert "'weight': 10" in str(front["user_config"]), "the ingress router was not told the weight"
    for _ in range(3):
        await report_running(c, clock, 16)  # checks each interval; the pause (30 s) passes
    assert (canary_state(c)["phase"], canary_state(c)["weight"]) == ("Weighted", 50)
    for _ in range(3):
        await report_running(c, clock, 16)
    assert canary_state(c)["phase"] == "Promoted"
    for _ in range(2):
        await report_running(c, clock, STABLE_S)
    status = c.body["status"]
    assert status["rollout"]["phase"] == "Serving" and status["history"][0]["outcome"] == "Serving"
    assert status["layout"]["base"] != status["layout"]["live"] == status["rollout"]["digest"]
    assert apps(c)["svc"]["args"] == base_args, "the base was rebuilt at the promotion"
    assert [n for n in apps(c) if side_app(n)] == sides, "the canary's copies were not kept as they were"
    assert {"CanaryStep", "CanaryPromoted", "RolloutComplete"} <= set(events(c))
    assert reader.asked and reader.asked[0].canary_version == "2" and reader.asked[0].live_version == "1"


async def test_a_failing_version_is_aborted_and_its_copies_drain_then_go() -> None:
    c, clock, reader = canaried()
    await serving_v1(c, clock)
    c.publish(graph("2"))
    await c.reconcile()
    await report_running(c, clock)
    assert canary_state(c)["weight"] == 10
    reader.evidence = FAILING
    await report_running(c, clock, 16)
    status = c.body["status"]
    assert status["history"][1]["outcome"] == "RolledBack"
    assert 'node "model"' in status["history"][1]["message"] and "10 %" in status["history"][1]["message"]
    warnings = [m for t, r, m in c.api.events if t == "Warning" and r == "CanaryAborted"]
    assert warnings and 'node "model"' in warnings[0]
    assert status["rollout"]["cause"] == "rollback" and status["rollout"]["retiring"]
    ended = status["rollout"]["canary"]  # the rollback shows the canary that ended it
    assert ended["phase"] == "Aborted" and ended["weight"] == 0 and 'node "model"' in ended["message"], ended
    assert [n for n in apps(c) if side_app(n)], "the aborted copies went before their requests could finish"
    for _ in range(2):
        await report_running(c, clock, STABLE_S)
    assert c.body["status"]["rollout"]["phase"] == "Serving"
    assert [n for n in apps(c) if side_app(n)] == [], "the aborted canary's copies stayed"
    assert c.body["status"]["layout"]["base"] == c.body["status"]["layout"]["live"]


async def test_a_version_that_cannot_be_canaried_rolls_out_whole_and_says_why() -> None:
    c, clock, _ = canaried()
    c.publish(graph("1", ingress_user_code=True))
    await c.started()
    for _ in range(2):
        await report_running(c, clock, STABLE_S)
    c.publish(graph("2", ingress_user_code=True))
    await c.reconcile()
    assert canary_state(c)["phase"] == "NotCanaried" and "IngressChanged" in canary_state(c)["message"]
    assert "NotCanaried" in events(c)
    assert [n for n in apps(c) if side_app(n)] == [] and "v2" in str(apps(c)["svc"]["args"])


async def test_a_new_leader_resumes_the_canary_at_its_step() -> None:
    c, clock, reader = canaried()
    await serving_v1(c, clock)
    c.publish(graph("2"))
    await c.reconcile()
    reader.evidence = GOOD
    await report_running(c, clock)
    for _ in range(3):
        await report_running(c, clock, 16)
    assert canary_state(c)["step"] == 2
    config = c.api.rayservices[KEY]["spec"]["serveConfigV2"]
    c.reconciler = Reconciler(c.api, c.registry, Metrics(), c.queue, wall=clock, evidence=reader)  # nothing in memory
    c.watch_rayservice()
    c.watch_servegraph()
    c.api.calls.clear()
    await c.reconcile()
    assert (canary_state(c)["step"], canary_state(c)["weight"]) == (2, 50), "the new leader did not resume the step"
    assert c.api.rayservices[KEY]["spec"]["serveConfigV2"] == config
    assert "apply_rayservice" not in c.api.calls, "the new leader rewrote the RayService"


async def test_a_publish_during_a_canary_restarts_it_for_the_newest_version() -> None:
    c, clock, reader = canaried()
    await serving_v1(c, clock)
    c.publish(graph("2"))
    await c.reconcile()
    reader.evidence = GOOD
    await report_running(c, clock)
    c.publish(graph("3"))
    await c.reconcile()
    status = c.body["status"]
    assert status["rollout"]["version"] == "3" and canary_state(c)["phase"] == "Deploying"
    assert [(h["version"], h["outcome"]) for h in status["history"][:2]] == [("3", "Progressing"), ("2", "Superseded")]


async def test_promote_by_hand_ends_the_canary_once() -> None:
    c, clock, reader = canaried()
    await serving_v1(c, clock)
    c.publish(graph("2"))
    await c.reconcile()
    reader.evidence = Evidence("prometheus", Counts(1, 0, 30.0), Counts(5, 0, 30.0))  # too few requests: waiting
    await report_running(c, clock)
    c.body["metadata"].setdefault("annotations", {})[CANARY_ANNOTATION] = "promote@2026-11-28T00:00:00Z"
    c.watch_servegraph()
    await c.reconcile()
    assert canary_state(c)["phase"] == "Promoted" and canary_state(c)["actionSeen"].startswith("promote@")
    assert "servegraph promote" in canary_state(c)["message"]
    body = copy.deepcopy(c.body)
    assert body["status"]["rollout"]["phase"] == "Progressing"


async def test_a_quiet_cluster_still_checks_the_canary_each_interval_until_promoted() -> None:
    """Nothing but the reconcile's own requeue moves a canary whose weight holds: KubeRay's
    status does not change then. Each reconcile asks to be run again by the next check."""
    c, clock, reader = canaried()
    await serving_v1(c, clock)
    c.publish(graph("2"))
    await c.reconcile()
    reader.evidence = GOOD
    await report_running(c, clock)
    assert canary_state(c)["phase"] == "Weighted"
    checks = 0
    while canary_state(c)["phase"] == "Weighted":
        delay = await c.reconcile()  # as the queue would run it, `delay` seconds later
        c.watch_servegraph()
        assert delay is not None
        if canary_state(c)["phase"] == "Weighted":
            assert delay <= 15, f"the next check was not asked for: {delay} s, at check {checks}"
        clock.now += delay
        checks += 1
        assert checks < 20, canary_state(c)
    assert canary_state(c)["phase"] == "Promoted", canary_state(c)
    assert checks >= 4, f"two 30 s steps were judged in {checks} checks"
