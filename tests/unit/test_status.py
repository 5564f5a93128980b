"""`status.report`, by table: what the reconcile observed → the status patch, the log
transitions and the Events, from the status already written."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from support import SAMPLES

from servegraph.graph import load_graph
from servegraph.names import ConditionType
from servegraph.operator.conditions import Condition
from servegraph.operator.kuberay import MAX_MESSAGE, MAX_MESSAGES, blocking_problem, mirror_applications, mirror_pending
from servegraph.operator.status.report import report
from servegraph.operator.values import Event, GoodGraph, Observed, Outcome

GRAPH = load_graph(SAMPLES / "mini.pb")
GOOD = GoodGraph.of(GRAPH, "ab" * 32, b"")
NEWER = GoodGraph.of(GRAPH, "cd" * 32, b"")
T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"

FETCHED = Condition(ConditionType.FETCHED, True, "Downloaded", "downloaded 300 bytes from https://r/mini")
NOT_MODIFIED = Condition(ConditionType.FETCHED, True, "NotModified", 'https://r/mini has not changed (ETag "e1")')
UNAUTHORIZED = Condition(ConditionType.FETCHED, False, "Unauthorized", "https://r/mini answered HTTP 401")
VALID = Condition(ConditionType.GRAPH_VALID, True, "Valid", "graph mini version '1': 1 applications, 2 nodes")
INVALID = Condition(ConditionType.GRAPH_VALID, False, "InvalidGraph", "cannot decode binary protobuf")
APPLIED = Condition(ConditionType.APPLIED, True, "UpToDate", "RayService mini matches the graph and spec")
NO_GRAPH = Condition(ConditionType.APPLIED, False, "NoValidGraph", "no valid graph has been downloaded yet")
RUNNING = {"sentiment": {"status": "RUNNING", "deployments": {}}}
UPGRADE = {"activeRayCluster": "mini-a", "pendingRayCluster": "mini-b", "applications": {"sentiment": "DEPLOYING"}}

# What Ray Serve says of replicas no node has room for (the shape KubeRay copies from the dashboard).
UNSCHEDULED = (
    "Deployment 'tokenizer' in application 'sentiment' has 1 replicas that have taken more than 30s to be "
    'scheduled. Resources required for each replica: {"CPU": 0.1}, total resources available: {}.'
)


def kuberay_rayservice(apps: dict[str, Any] | None = None, head_ready: str = "True") -> dict[str, Any]:
    """A RayService as KubeRay v1.6 reports its first cluster starting: everything under pendingServiceStatus."""
    return {
        "status": {
            "activeServiceStatus": {"rayClusterStatus": {"desiredCPU": "0"}},
            "pendingServiceStatus": {
                "rayClusterName": "mini-x7k2p",
                "rayClusterStatus": {
                    "desiredCPU": "2",
                    "desiredWorkerReplicas": 1,  # ready and available: 0, which KubeRay omits
                    "conditions": [
                        {"type": "RayClusterProvisioned", "status": "False", "reason": "RayClusterPodsProvisioning"},
                        {"type": "HeadPodReady", "status": head_ready, "reason": "Unknown", "message": ""},
                    ],
                },
                "applicationStatuses": apps or {},
            },
        }
    }


STUCK_APPS = {
    "sentiment": {
        "status": "DEPLOYING",
        "serveDeploymentStatuses": {
            "sentiment": {"status": "HEALTHY"},
            "tokenizer": {"status": "UPDATING", "message": UNSCHEDULED},
        },
    }
}
PENDING = mirror_pending(kuberay_rayservice(STUCK_APPS))
PENDING_NO_APPS = mirror_pending(kuberay_rayservice(head_ready="False"))


def steady() -> dict[str, Any]:
    """The status after a first successful reconcile at T0, applications not reported yet."""
    observed = Observed(Outcome(FETCHED, VALID, APPLIED), GOOD, '"e1"', "mini", {})
    return report({}, 1, observed, T0).status


@dataclass
class Row:
    id: str
    old: dict[str, Any]
    observed: Observed
    patched: set[str]
    """Top-level status fields the patch writes (empty: no write at all)."""
    transitions: list[tuple[str, str, str]]
    """(type, status, reason) of the conditions logged as changed."""
    events: list[tuple[str, str]]
    conditions: dict[str, tuple[str, str]] = field(default_factory=dict)
    """type → (status, reason) expected in the new status, for the conditions that matter."""


ROWS = [
    Row(
        "first download and apply",
        {},
        Observed(
            Outcome(FETCHED, VALID, APPLIED, (Event("Normal", "Fetched", "f"), Event("Normal", "Applied", "a"))),
            GOOD,
            '"e1"',
            "mini",
            {},
        ),
        {"observedGeneration", "conditions", "graph", "source", "rayServiceName", "applications"},
        [
            ("Fetched", "True", "Downloaded"),
            ("GraphValid", "True", "Valid"),
            ("Applied", "True", "UpToDate"),
            ("Ready", "False", "WaitingForApplications"),
        ],
        [("Normal", "Applied")],  # one Normal event: Applied says what Fetched would
    ),
    Row(
        "nothing changed: no write, nothing to say",
        steady(),
        Observed(Outcome(applied=APPLIED), GOOD, '"e1"', "mini", {}),
        set(),
        [],
        [],
    ),
    Row(
        "a Normal event without a status change is still posted",
        steady(),
        Observed(Outcome(applied=APPLIED, events=(Event("Normal", "Applied", "updated"),)), GOOD, '"e1"', "mini", {}),
        set(),
        [],
        [("Normal", "Applied")],
    ),
    Row(
        "the registry refuses after a good download: the graph keeps running",
        steady(),
        Observed(Outcome(fetched=UNAUTHORIZED, applied=APPLIED), GOOD, '"e1"', "mini", {}),
        {"conditions"},
        [("Fetched", "False", "Unauthorized")],
        [("Warning", "FetchFailed")],
        {"Fetched": ("False", "Unauthorized"), "GraphValid": ("True", "Valid"), "Applied": ("True", "UpToDate")},
    ),
    Row(
        "the same failure again: no write and no second warning",
        report(
            steady(), 1, Observed(Outcome(fetched=UNAUTHORIZED, applied=APPLIED), GOOD, '"e1"', "mini", {}), T1
        ).status,
        Observed(Outcome(fetched=UNAUTHORIZED, applied=APPLIED), GOOD, '"e1"', "mini", {}),
        set(),
        [],
        [],
    ),
    Row(
        "not modified: a new reason is logged but warns nobody",
        steady(),
        Observed(Outcome(fetched=NOT_MODIFIED, applied=APPLIED), GOOD, '"e1"', "mini", {}),
        {"conditions"},
        [("Fetched", "True", "NotModified")],
        [],
    ),
    Row(
        "an invalid first graph: no graph in the status, Ready says why",
        {},
        Observed(Outcome(FETCHED, INVALID, NO_GRAPH), None, None, None, None),
        {"observedGeneration", "conditions"},
        [
            ("Fetched", "True", "Downloaded"),
            ("GraphValid", "False", "InvalidGraph"),
            ("Applied", "False", "NoValidGraph"),
            ("Ready", "False", "NoValidGraph"),
        ],
        [("Warning", "InvalidGraph"), ("Warning", "ApplyFailed")],
    ),
    Row(
        "every application RUNNING: Ready",
        steady(),
        Observed(Outcome(applied=APPLIED), GOOD, '"e1"', "mini", RUNNING),
        {"conditions", "applications"},
        [("Ready", "True", "AllApplicationsRunning")],
        [],
    ),
    Row(
        "the RayService is gone: Ready turns False",
        steady(),
        Observed(Outcome(applied=APPLIED), GOOD, '"e1"', "mini", None),
        {"conditions"},
        [("Ready", "False", "RayServiceMissing")],
        [],
    ),
    Row(
        "KubeRay builds a new cluster: not Ready while the old one serves, and the status says so",
        report(steady(), 1, Observed(Outcome(applied=APPLIED), GOOD, '"e1"', "mini", RUNNING), T1).status,
        Observed(Outcome(applied=APPLIED), GOOD, '"e1"', "mini", RUNNING, UPGRADE),
        {"conditions", "upgrade"},
        [("Ready", "False", "UpgradeInProgress")],
        [],
    ),
    Row(
        "the upgrade is done: Ready again and the upgrade leaves the status",
        report(steady(), 1, Observed(Outcome(applied=APPLIED), GOOD, '"e1"', "mini", RUNNING, UPGRADE), T1).status,
        Observed(Outcome(applied=APPLIED), GOOD, '"e1"', "mini", RUNNING),
        {"conditions", "upgrade"},
        [("Ready", "True", "AllApplicationsRunning")],
        [],
    ),
    Row(
        "the first cluster is starting: its applications and Ray's messages are in the status",
        steady(),
        Observed(Outcome(applied=APPLIED), GOOD, '"e1"', "mini", {}, pending=PENDING),
        {"conditions", "pending"},
        [("Ready", "False", "ApplicationsNotRunning")],
        [],
    ),
    Row(
        "the first cluster is starting and Ray Serve reports nothing yet: still waiting, the cluster named",
        steady(),
        Observed(Outcome(applied=APPLIED), GOOD, '"e1"', "mini", {}, pending=PENDING_NO_APPS),
        {"conditions", "pending"},
        [("Ready", "False", "WaitingForApplications")],
        [],
    ),
    Row(
        "KubeRay switched to the started cluster: the pending section leaves the status",
        report(steady(), 1, Observed(Outcome(applied=APPLIED), GOOD, '"e1"', "mini", {}, pending=PENDING), T1).status,
        Observed(Outcome(applied=APPLIED), GOOD, '"e1"', "mini", RUNNING),
        {"conditions", "applications", "pending"},
        [("Ready", "True", "AllApplicationsRunning")],
        [],
    ),
    Row(
        "a new graph: its digest and a new fetch time",
        steady(),
        Observed(Outcome(FETCHED, VALID, APPLIED), NEWER, '"e2"', "mini", {}),
        {"graph", "source"},
        [],
        [],
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_report(row: Row) -> None:
    result = report(row.old, 1, row.observed, T1)
    assert set(result.patch) == row.patched
    assert [(c["type"], c["status"], c["reason"]) for c in result.transitions] == row.transitions
    assert [(e.type, e.reason) for e in result.events] == row.events
    got = {c["type"]: (c["status"], c["reason"]) for c in result.status["conditions"]}
    for type_, expected in row.conditions.items():
        assert got[type_] == expected


def test_a_transition_time_moves_only_when_the_status_does() -> None:
    old = steady()
    flipped = report(old, 1, Observed(Outcome(fetched=UNAUTHORIZED, applied=APPLIED), GOOD, '"e1"', "mini", {}), T1)
    times = {c["type"]: c["lastTransitionTime"] for c in flipped.status["conditions"]}
    assert times == {"Fetched": T1, "GraphValid": T0, "Applied": T0, "Ready": T0}


def test_the_fetch_time_moves_with_the_digest_not_with_every_download() -> None:
    old = steady()
    same = report(old, 1, Observed(Outcome(FETCHED, VALID, APPLIED), GOOD, '"e1"', "mini", {}), T1)
    newer = report(old, 1, Observed(Outcome(FETCHED, VALID, APPLIED), NEWER, '"e2"', "mini", {}), T1)
    assert same.status["source"]["lastFetchTime"] == T0
    assert newer.status["source"] == {"etag": '"e2"', "lastFetchTime": T1}
    assert newer.patch["graph"] == {"digest": "sha256:" + "cd" * 32, "shortDigest": "cd" * 6}


def test_warnings_carry_the_reason_and_message() -> None:
    result = report(steady(), 1, Observed(Outcome(fetched=UNAUTHORIZED, applied=APPLIED), GOOD, None, "mini", {}), T1)
    assert result.events == [Event("Warning", "FetchFailed", "Unauthorized: https://r/mini answered HTTP 401")]


def test_the_generation_is_recorded_on_the_status_and_on_each_condition() -> None:
    result = report(steady(), 7, Observed(Outcome(applied=APPLIED), GOOD, '"e1"', "mini", {}), T1)
    assert result.patch["observedGeneration"] == 7
    assert {c["observedGeneration"] for c in result.status["conditions"]} == {7}


def test_the_upgrade_message_names_both_clusters_and_the_pending_applications() -> None:
    status = report(steady(), 1, Observed(Outcome(), GOOD, '"e1"', "mini", RUNNING, UPGRADE), T1).status
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["message"] == (
        "KubeRay is starting Ray cluster mini-b for this version (sentiment: DEPLOYING); "
        "mini-a serves the previous one until then"
    )
    assert status["upgrade"] == UPGRADE


INCREMENTAL = {
    **UPGRADE,
    "applications": {"sentiment": "RUNNING"},
    "incremental": {
        "active": {"trafficRoutedPercent": 75, "targetCapacity": 100},
        "pending": {"trafficRoutedPercent": 25, "targetCapacity": 50},
    },
}


def test_an_incremental_upgrade_says_the_split_and_keeps_it_in_the_status() -> None:
    status = report(steady(), 1, Observed(Outcome(), GOOD, '"e1"', "mini", RUNNING, INCREMENTAL), T1).status
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "UpgradeInProgress")
    assert ready["message"] == (
        "KubeRay moves the requests in steps: 25 % to Ray cluster mini-b (target capacity 50 %), "
        "75 % to mini-a (target capacity 100 %) (sentiment: RUNNING)"
    )
    assert status["upgrade"] == INCREMENTAL


def test_kuberays_rollback_is_its_own_reason() -> None:
    back = {**INCREMENTAL, "rollingBack": True}
    status = report(steady(), 1, Observed(Outcome(), GOOD, '"e1"', "mini", RUNNING, back), T1).status
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "RollbackInProgress")
    assert ready["message"].startswith(
        "KubeRay moves the requests back (RollbackInProgress): 75 % to Ray cluster mini-a"
    )


def _ready(status: dict[str, Any]) -> str:
    message: str = next(c for c in status["conditions"] if c["type"] == "Ready")["message"]
    return message


def test_pending_mirrors_the_cluster_kuberay_is_starting_compactly() -> None:
    # Not KubeRay's copy of the RayCluster status: KubeRay does not keep it current in the RayService.
    assert PENDING == {
        "rayClusterName": "mini-x7k2p",
        "applications": {
            "sentiment": {
                "status": "DEPLOYING",
                "deployments": {
                    "sentiment": {"status": "HEALTHY"},
                    "tokenizer": {"status": "UPDATING", "message": UNSCHEDULED},
                },
            }
        },
    }
    # KubeRay writes an empty pendingServiceStatus (the RayCluster status of none) when nothing is pending.
    assert mirror_pending({"status": {"pendingServiceStatus": {"rayClusterStatus": {"desiredCPU": "0"}}}}) is None
    assert mirror_pending(None) is None


def test_ready_names_the_first_blocking_problem_of_the_first_cluster() -> None:
    status = report(steady(), 1, Observed(Outcome(), GOOD, '"e1"', "mini", {}, pending=PENDING), T1).status
    assert status["pending"] == PENDING
    assert _ready(status) == (
        f'KubeRay is starting Ray cluster mini-x7k2p: application "sentiment": deployment "tokenizer": {UNSCHEDULED}; '
        "sentiment: DEPLOYING"
    )


def test_a_started_cluster_kuberay_has_not_switched_to_yet_is_not_ready() -> None:
    running = mirror_pending(kuberay_rayservice({"sentiment": {"status": "RUNNING"}}))
    status = report(steady(), 1, Observed(Outcome(), GOOD, '"e1"', "mini", {}, pending=running), T1).status
    assert _ready(status) == (
        "KubeRay is starting Ray cluster mini-x7k2p: every application RUNNING; KubeRay has not switched to it yet"
    )


def test_before_ray_serve_reports_the_cluster_is_named_and_where_to_see_its_pods() -> None:
    assert PENDING_NO_APPS == {"rayClusterName": "mini-x7k2p", "applications": {}}
    status = report(steady(), 1, Observed(Outcome(), GOOD, '"e1"', "mini", {}, pending=PENDING_NO_APPS), T1).status
    assert _ready(status) == (
        "KubeRay is starting Ray cluster mini-x7k2p: Ray Serve reports no application yet (KubeRay deploys them "
        "once the head pod runs); `servegraph status` lists its pods and why they are not running"
    )


def test_an_upgrade_stuck_on_its_new_cluster_says_why() -> None:
    status = report(steady(), 1, Observed(Outcome(), GOOD, '"e1"', "mini", RUNNING, UPGRADE, PENDING), T1).status
    assert _ready(status) == (
        "KubeRay is starting Ray cluster mini-b for this version (sentiment: DEPLOYING); "
        f'mini-a serves the previous one until then; application "sentiment": deployment "tokenizer": {UNSCHEDULED}'
    )


def test_a_failed_application_comes_before_a_slow_one_and_a_node_before_its_application() -> None:
    apps = {
        "a1": {"status": "DEPLOYING", "deployments": {"n1": {"status": "UPDATING", "message": "slow"}}},
        "a2": {
            "status": "DEPLOY_FAILED",
            "message": "Deploying app 'a2' failed",
            "deployments": {
                "n2": {"status": "HEALTHY", "message": "fine"},
                "n3": {"status": "UNHEALTHY", "message": "RuntimeError: no model"},
            },
        },
    }
    assert blocking_problem(apps, None, ["a1", "a2"]) == 'application "a2": deployment "n3": RuntimeError: no model'
    del apps["a2"]["deployments"]["n3"]
    assert blocking_problem(apps, None, ["a1", "a2"]) == "application \"a2\": Deploying app 'a2' failed"
    apps["a2"]["status"] = "RUNNING"
    assert blocking_problem(apps, None, ["a1", "a2"]) == 'application "a1": deployment "n1": slow'
    # The cluster being started comes first; without a message there is nothing to name.
    assert blocking_problem(apps, PENDING, ["a1"]) == f'application "sentiment": deployment "tokenizer": {UNSCHEDULED}'
    assert blocking_problem({"a": {"status": "DEPLOYING", "deployments": {}}}, None, ["a"]) is None


def test_messages_are_bounded_and_keep_what_failed_and_why() -> None:
    frames = "".join(f'  File "/ray/serve/_private/x{i}.py", line {i}, in f\n    call()\n' for i in range(300))
    traceback = (
        "Deploying app 'sentiment' failed with exception:\nTraceback (most recent call last):\n"
        f"{frames}RuntimeError: the model file is missing"
    )
    resources = "Replicas wait: " + ", ".join(f'"node-{i}": {{"CPU": 4}}' for i in range(200)) + ". total: {}."
    body = {"status": {"activeServiceStatus": {"applicationStatuses": {}}}}
    apps = body["status"]["activeServiceStatus"]["applicationStatuses"]
    apps["sentiment"] = {
        "status": "DEPLOY_FAILED",
        "message": traceback,
        "serveDeploymentStatuses": {"sentiment": {"status": "UPDATING", "message": resources}},
    }
    mirrored = mirror_applications(body)["sentiment"]
    assert len(traceback) > 10 * MAX_MESSAGE
    assert mirrored["message"] == (
        "Deploying app 'sentiment' failed with exception:\nRuntimeError: the model file is missing"
    )
    long = mirrored["deployments"]["sentiment"]["message"]
    assert len(long) <= MAX_MESSAGE and long.startswith("Replicas wait: ") and long.endswith(". total: {}.")

    # Many failing nodes: at most MAX_MESSAGES messages, the unhealthy ones first.
    deployments = {f"n{i:02}": {"status": "UPDATING", "message": f"slow {i}"} for i in range(MAX_MESSAGES)}
    deployments["z-broken"] = {"status": "UNHEALTHY", "message": "broken"}
    deployments["ok"] = {"status": "HEALTHY", "message": "fine"}
    apps["sentiment"] = {"status": "DEPLOYING", "serveDeploymentStatuses": deployments}
    kept = mirror_applications(body)["sentiment"]["deployments"]
    assert sum("message" in d for d in kept.values()) == MAX_MESSAGES
    assert kept["z-broken"]["message"] == "broken" and "message" not in kept["ok"]
    assert kept["n31"] == {"status": "UPDATING"}, "the last by name of the slow ones is dropped"


def test_a_conflict_mirrors_no_pending_cluster() -> None:
    old = report(steady(), 1, Observed(Outcome(), GOOD, '"e1"', "mini", {}, pending=PENDING), T1).status
    observed = Observed(Outcome(), GOOD, '"e1"', "mini", None, pending=PENDING, conflict="someone else's")
    assert "pending" not in report(old, 1, observed, T1).status
