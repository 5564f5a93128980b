"""Suspend and resume through KubeRay's own `spec.suspend` (KubeRay 1.7), on the in-memory API:
the RayService is kept and rendered with `suspend: true`, never deleted. The same flow runs on a
real API server with the real KubeRay 1.7 in tests/integration/test_suspend_restart.py, and with
Ray pods in tests/node/test_suspend.py; KubeRay 1.6's (the RayService deleted) in
tests/unit/test_reconcile_suspend.py."""

from __future__ import annotations

from typing import Any

from reconcile_support import KEY, NAME, NS, Cluster
from test_reconcile_suspend import conditions, message, ready, serving, set_spec

from servegraph.operator.metrics import Metrics
from servegraph.operator.queue import WorkQueue
from servegraph.operator.reconcile import Reconciler
from servegraph.render.kuberay_features import KubeRayFeatures

KUBERAY_1_7 = KubeRayFeatures(
    suspend=True, ingress_options=True, incremental_upgrade=True, incremental_upgrade_by_default=True
)


def with_kuberay_1_7(c: Cluster) -> None:
    c.reconciler.deployer.kuberay = KUBERAY_1_7


def kuberay_suspends(c: Cluster, state: str) -> None:
    """KubeRay's handleSuspend: Suspending while it deletes the clusters, then Suspended, the
    services' statuses reset (its status subresource)."""
    obj = c.api.rayservices[KEY]
    status = {
        "observedGeneration": obj["metadata"]["generation"],
        "conditions": [{"type": state, "status": "True", "reason": "SuspendComplete"}],
        "activeServiceStatus": {},
        "pendingServiceStatus": {},
    }
    c.api.update_as("ray-operator", "RayService", KEY, {"status": status}, subresource="status")


async def test_suspend_renders_kuberays_own_suspend_and_keeps_the_rayservice() -> None:
    c, _ = await serving()
    with_kuberay_1_7(c)
    before = c.body["status"]
    serve_config = c.api.rayservices[KEY]["spec"]["serveConfigV2"]

    set_spec(c, suspend=True)
    assert await c.reconcile() is None, "no poll is scheduled while suspended"
    assert c.api.writes() == ["apply_rayservice", "patch_servegraph_status", "post_event"]
    rs = c.api.rayservices[KEY]
    assert rs["spec"]["suspend"] is True and "deletionTimestamp" not in rs["metadata"]
    assert rs["spec"]["serveConfigV2"] == serve_config, "the same version, only suspended"
    assert conditions(c) == {
        "Fetched": ("True", "Downloaded"),
        "GraphValid": ("True", "Valid"),
        "Applied": ("True", "Suspended"),
        "Progressing": ("False", "Suspended"),
        "Ready": ("False", "Suspended"),
    }
    assert message(c, "Applied") == "RayService mini has spec.suspend: KubeRay deletes its Ray cluster (Suspending)"
    assert c.api.events == [
        (
            "Normal",
            "Suspended",
            "set spec.suspend on RayService mini (spec.suspend); version '1' is kept and runs again on resume",
        )
    ]
    assert c.body["status"]["history"] == before["history"] and "applications" not in c.body["status"]

    # KubeRay deletes the clusters, then says Suspended: nothing more is written to it.
    c.api.calls.clear()
    for state in ("Suspending", "Suspended"):
        kuberay_suspends(c, state)
        c.watch_rayservice()
        await c.reconcile()
    assert "apply_rayservice" not in c.api.writes() and "delete_rayservice" not in c.api.writes()
    assert message(c, "Applied") == "RayService mini has spec.suspend: KubeRay deleted its Ray cluster (Suspended)"


async def test_resume_drops_suspend_and_runs_the_same_version_without_a_download() -> None:
    c, clock = await serving(pollInterval="1m")
    with_kuberay_1_7(c)
    history = c.body["status"]["history"]
    set_spec(c, suspend=True)
    await c.reconcile()
    kuberay_suspends(c, "Suspended")
    c.watch_rayservice()
    await c.reconcile()
    downloads = len(c.registry.requests)

    c.api.calls.clear()
    set_spec(c, suspend=False)
    await c.reconcile()
    assert c.api.writes()[:1] == ["apply_rayservice"]
    assert "suspend" not in c.api.rayservices[KEY]["spec"], "server-side apply drops the field it no longer sends"
    assert len(c.registry.requests) == downloads
    assert c.body["status"]["history"] == history, "a resume is no new rollout"
    c.watch_rayservice()
    await ready(c, clock)
    assert conditions(c)["Ready"] == ("True", "AllApplicationsRunning")


async def test_a_new_operator_renders_the_kept_version_suspended_and_writes_nothing() -> None:
    c, _ = await serving()
    with_kuberay_1_7(c)
    set_spec(c, suspend=True)
    await c.reconcile()
    kuberay_suspends(c, "Suspended")

    c.queue = WorkQueue()
    c.reconciler = Reconciler(c.api, c.registry, Metrics(), c.queue, kuberay=KUBERAY_1_7)
    c.watch_servegraph()
    c.watch_rayservice()
    c.api.calls.clear()
    await c.reconcile()
    assert c.api.writes() == ["patch_servegraph_status"], "rendered from the kept graph: the same object"
    assert conditions(c)["Ready"] == ("False", "Suspended")


async def test_a_suspend_undone_by_hand_is_repaired_and_none_is_created() -> None:
    c, _ = await serving()
    with_kuberay_1_7(c)
    set_spec(c, suspend=True)
    await c.reconcile()
    rs: dict[str, Any] = c.api.rayservices[KEY]
    rs["spec"]["suspend"] = False
    c.api.edit(rs)
    c.watch_rayservice()
    c.api.calls.clear()
    await c.reconcile()
    assert c.api.writes()[:1] == ["apply_rayservice"] and c.api.rayservices[KEY]["spec"]["suspend"] is True

    c.watch_rayservice(deleted=True)  # deleted by hand: a suspended ServeGraph creates none
    c.api.calls.clear()
    await c.reconcile()
    assert KEY not in c.api.rayservices and "apply_rayservice" not in c.api.writes()
    assert message(c, "Applied") == f"RayService {NAME} is deleted: no Ray cluster runs"
    assert NS and c.body["status"]["rayServiceName"] == NAME
