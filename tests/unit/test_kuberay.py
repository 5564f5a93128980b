"""What KubeRay's RayService means to servegraph (operator/kuberay.py), by table.

Every reading of a live RayService the operator makes goes through that one module: the
`Live` record, the upgrade in progress, the cluster still starting and the first problem
blocking a rollout. Each row is a RayService as KubeRay writes it and what servegraph reads.
"""

from __future__ import annotations

from typing import Any

import pytest

from servegraph.operator.kuberay import (
    MAX_MESSAGE,
    Live,
    Owner,
    blocking_problem,
    live_digest,
    live_record,
    mirror_applications,
    mirror_pending,
    mirror_upgrade,
    stranger,
    text_digest,
    traffic_split,
)


def rayservice(
    *,
    generation: int = 2,
    observed: int | None = 2,
    active: dict[str, Any] | None = None,
    pending: dict[str, Any] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    **meta: Any,
) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": conditions or []}
    if observed is not None:
        status["observedGeneration"] = observed
    if active is not None:
        status["activeServiceStatus"] = active
    if pending is not None:
        status["pendingServiceStatus"] = pending
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": "mini", "namespace": "ns", "generation": generation, "resourceVersion": "7", **meta},
        "spec": {"serveConfigV2": "applications: []\n", "rayClusterConfig": {"headGroupSpec": {}}},
        "status": status,
    }


def app(status: str, message: str = "", **deployments: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "status": status,
        "serveDeploymentStatuses": {d: {"status": s} for d, s in deployments.items()},
    }
    if message:
        out["message"] = message
    return out


OWNER = {"apiVersion": "servegraph.io/v1alpha1", "kind": "ServeGraph", "name": "mini", "uid": "u1", "controller": True}

# (what KubeRay wrote, what servegraph reads of it: a few fields of `Live`)
LIVE_ROWS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "KubeRay acted on the spec: settled",
        rayservice(generation=2, observed=2),
        {"settled": True, "deleting": False, "resource_version": "7"},
    ),
    ("KubeRay has not acted on the new generation yet", rayservice(generation=3, observed=2), {"settled": False}),
    ("no status at all yet: not settled", rayservice(generation=1, observed=None), {"settled": False}),
    (
        "deleted, waiting for KubeRay's finalizer",
        rayservice(deletionTimestamp="2026-01-01T00:00:00Z"),
        {"deleting": True},
    ),
    (
        "the controller owner reference says whose it is",
        rayservice(ownerReferences=[OWNER, {**OWNER, "name": "x", "controller": False}]),
        {"owner": Owner("ServeGraph", "mini", "u1")},
    ),
    (
        "managers that wrote it, not KubeRay's status writes",
        rayservice(
            managedFields=[
                {"manager": "kubectl", "operation": "Apply"},
                {"manager": "ray-operator", "subresource": "status"},
                {"manager": "helm"},
            ]
        ),
        {"owner": None, "managers": ("helm", "kubectl")},
    ),
    (
        "the active cluster's applications, in name order, each deployment's status",
        rayservice(active={"applicationStatuses": {"b": app("RUNNING", n1="HEALTHY"), "a": app("DEPLOYING")}}),
        {
            "applications": {
                "a": {"status": "DEPLOYING", "deployments": {}},
                "b": {"status": "RUNNING", "deployments": {"n1": {"status": "HEALTHY"}}},
            }
        },
    ),
]


@pytest.mark.parametrize(("why", "body", "expected"), LIVE_ROWS, ids=[r[0] for r in LIVE_ROWS])
def test_live_record(why: str, body: dict[str, Any], expected: dict[str, Any]) -> None:
    live = live_record(body, matched=None)
    assert {field: getattr(live, field) for field in expected} == expected
    assert live.serve_digest == live_digest(body) == text_digest("applications: []\n")
    assert live.cluster == {"headGroupSpec": {}}


def test_a_record_not_compared_keeps_the_object_and_a_compared_one_does_not() -> None:
    body = rayservice()
    assert live_record(body, None, compared=False).raw == body
    assert live_record(body, ("hash", "u1")).raw is None


def test_a_stranger_keeps_whose_it_is_and_nothing_of_its_status() -> None:
    body = rayservice(
        ownerReferences=[{**OWNER, "kind": "Other"}], active={"applicationStatuses": {"a": app("RUNNING")}}
    )
    assert stranger(body) == Live(None, {}, owner=Owner("Other", "mini", "u1"), resource_version="7")


ACTIVE = {"rayClusterName": "mini-old", "applicationStatuses": {"a": app("RUNNING")}}
UPGRADING = {"type": "UpgradeInProgress", "status": "True"}

# (KubeRay's status, the upgrade servegraph reports: None when there is none)
UPGRADE_ROWS: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = [
    ("nothing pending", rayservice(active=ACTIVE, pending={}), None),
    (
        "the first cluster starting is no upgrade",
        rayservice(pending={"rayClusterName": "mini-new", "applicationStatuses": {"a": app("DEPLOYING")}}),
        None,
    ),
    (
        "a new cluster beside the active one",
        rayservice(
            active=ACTIVE, pending={"rayClusterName": "mini-new", "applicationStatuses": {"a": app("DEPLOYING")}}
        ),
        {"activeRayCluster": "mini-old", "pendingRayCluster": "mini-new", "applications": {"a": "DEPLOYING"}},
    ),
    (
        "KubeRay's UpgradeInProgress before it names the new cluster",
        rayservice(active=ACTIVE, conditions=[UPGRADING]),
        {"activeRayCluster": "mini-old", "pendingRayCluster": "", "applications": {}},
    ),
]


ROLLING_BACK = {"type": "RollbackInProgress", "status": "True", "reason": "DesiredClusterSpecChanged"}
MOVED = "2026-11-28T10:00:10Z"


def incremental(*, conditions: list[dict[str, Any]] | None = None, **shares: dict[str, Any]) -> dict[str, Any]:
    """A RayService in KubeRay 1.7's incremental upgrade: both clusters' statuses carry their shares."""
    body = rayservice(
        active={**ACTIVE, **shares.get("active", {})},
        pending={
            "rayClusterName": "mini-new",
            "applicationStatuses": {"a": app("RUNNING")},
            **shares.get("pending", {}),
        },
        conditions=[UPGRADING, *(conditions or [])],
    )
    body["spec"]["upgradeStrategy"] = {"type": "NewClusterWithIncrementalUpgrade"}
    return body


STEP = {
    "active": {"targetCapacity": 100, "trafficRoutedPercent": 75, "lastTrafficMigratedTime": MOVED},
    "pending": {"targetCapacity": 50, "trafficRoutedPercent": 25, "lastTrafficMigratedTime": MOVED},
}
UPGRADE_ROWS += [
    (
        "an incremental upgrade: each cluster's share of the requests and its target capacity",
        incremental(**STEP),
        {
            "activeRayCluster": "mini-old",
            "pendingRayCluster": "mini-new",
            "applications": {"a": "RUNNING"},
            "incremental": {
                "active": {"trafficRoutedPercent": 75, "targetCapacity": 100, "lastTrafficMigratedTime": MOVED},
                "pending": {"trafficRoutedPercent": 25, "targetCapacity": 50, "lastTrafficMigratedTime": MOVED},
            },
        },
    ),
    (
        "its first moment: KubeRay has not written the new cluster's share yet",
        incremental(),
        {
            "activeRayCluster": "mini-old",
            "pendingRayCluster": "mini-new",
            "applications": {"a": "RUNNING"},
            "incremental": {"active": {}, "pending": {}},
        },
    ),
    (
        "the spec went back mid-upgrade: KubeRay's RollbackInProgress",
        incremental(conditions=[ROLLING_BACK], **STEP),
        {
            "activeRayCluster": "mini-old",
            "pendingRayCluster": "mini-new",
            "applications": {"a": "RUNNING"},
            "incremental": {
                "active": {"trafficRoutedPercent": 75, "targetCapacity": 100, "lastTrafficMigratedTime": MOVED},
                "pending": {"trafficRoutedPercent": 25, "targetCapacity": 50, "lastTrafficMigratedTime": MOVED},
            },
            "rollingBack": True,
        },
    ),
    (
        "figures out of range or of another type are clamped or left out",
        incremental(
            active={"targetCapacity": 250, "trafficRoutedPercent": True, "lastTrafficMigratedTime": "x" * 100},
            pending={"targetCapacity": -5, "trafficRoutedPercent": "25"},
        ),
        {
            "activeRayCluster": "mini-old",
            "pendingRayCluster": "mini-new",
            "applications": {"a": "RUNNING"},
            "incremental": {"active": {"targetCapacity": 100}, "pending": {"targetCapacity": 0}},
        },
    ),
]


@pytest.mark.parametrize(("why", "body", "expected"), UPGRADE_ROWS, ids=[r[0] for r in UPGRADE_ROWS])
def test_mirror_upgrade(why: str, body: dict[str, Any], expected: dict[str, Any] | None) -> None:
    assert mirror_upgrade(body) == expected


def test_a_new_cluster_upgrade_is_no_split_in_words() -> None:
    assert traffic_split(mirror_upgrade(rayservice(active=ACTIVE, pending={"rayClusterName": "mini-new"}))) is None
    assert traffic_split(None) is None


def test_the_split_in_words_names_the_new_cluster_first_and_the_rollback_the_old_one() -> None:
    assert traffic_split(mirror_upgrade(incremental(**STEP))) == (
        "KubeRay moves the requests in steps: 25 % to Ray cluster mini-new (target capacity 50 %), "
        "75 % to mini-old (target capacity 100 %)"
    )
    assert traffic_split(mirror_upgrade(incremental(conditions=[ROLLING_BACK], **STEP))) == (
        "KubeRay moves the requests back (RollbackInProgress): 75 % to Ray cluster mini-old (target capacity 100 %), "
        "25 % to mini-new (target capacity 50 %)"
    )
    assert traffic_split(mirror_upgrade(incremental())) == (
        "KubeRay moves the requests in steps: ? % to Ray cluster mini-new, ? % to mini-old"
    )


def test_an_empty_pending_status_is_no_pending_cluster() -> None:
    assert mirror_pending(rayservice(pending={})) is None
    assert mirror_pending(rayservice(pending={"rayClusterName": "c", "applicationStatuses": {}})) == {
        "rayClusterName": "c",
        "applications": {},
    }


UNSCHEDULABLE = "Deployment 'n3' has 1 replicas that have taken more than 30s to be scheduled."

# (active applications as mirrored, the pending cluster as mirrored, the graph's applications, the problem named)
BLOCKER_ROWS: list[tuple[str, dict[str, Any], dict[str, Any] | None, list[str], str | None]] = [
    ("all running: nothing blocks", mirror_applications(rayservice(active=ACTIVE)), None, ["a"], None),
    (
        "a failed application before a deploying one, though listed later",
        {
            "a": {"status": "DEPLOYING", "message": "slow", "deployments": {}},
            "b": {"status": "DEPLOY_FAILED", "message": "ImportError: no module x", "deployments": {}},
        },
        None,
        ["a", "b"],
        'application "b": ImportError: no module x',
    ),
    (
        "an unhealthy deployment's message names the node",
        {
            "a": {
                "status": "DEPLOYING",
                "message": "app",
                "deployments": {"n3": {"status": "UNHEALTHY", "message": UNSCHEDULABLE}},
            }
        },
        None,
        ["a"],
        f'application "a": deployment "n3": {UNSCHEDULABLE}',
    ),
    (
        "the cluster being started comes first",
        {"a": {"status": "DEPLOY_FAILED", "message": "old version", "deployments": {}}},
        {
            "rayClusterName": "mini-new",
            "applications": {"a": {"status": "DEPLOYING", "message": "new", "deployments": {}}},
        },
        ["a"],
        'application "a": new',
    ),
    (
        "a pending cluster with no application yet: where to look",
        {},
        {"rayClusterName": "mini-new", "applications": {}},
        ["a"],
        "Ray cluster mini-new: Ray Serve reports no application yet (KubeRay deploys them once the head pod runs); "
        "`servegraph status` lists its pods and why they are not running",
    ),
]


@pytest.mark.parametrize(
    ("why", "active", "pending", "expected_apps", "problem"), BLOCKER_ROWS, ids=[r[0] for r in BLOCKER_ROWS]
)
def test_blocking_problem(
    why: str, active: dict[str, Any], pending: dict[str, Any] | None, expected_apps: list[str], problem: str | None
) -> None:
    assert blocking_problem(active, pending, expected_apps) == problem


def test_a_long_message_keeps_its_head_and_its_tail_within_the_bound() -> None:
    message = "Ray says what failed. " + "x" * 5000 + " ValueError: why"
    mirrored = mirror_applications(rayservice(active={"applicationStatuses": {"a": app("DEPLOY_FAILED", message)}}))
    kept = mirrored["a"]["message"]
    assert len(kept) <= MAX_MESSAGE and kept.startswith("Ray says what failed.") and kept.endswith("ValueError: why")
