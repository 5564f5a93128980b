"""Suspend, resume and restart against the real API server and the real KubeRay.

No kubelet runs here, so no Ray pod starts: what is checked is what the API server and
KubeRay do with what the operator writes. Suspending deletes the RayService (KubeRay's
finalizer removes its RayCluster first) and keeps the ServeGraph's status and kept graphs;
resuming creates it again from the kept graph, without a download; `servegraph restart`
puts the annotation into every pod template and KubeRay prepares a new cluster for it.
With Ray pods answering requests: tests/node/test_suspend.py.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes_asyncio.client.rest import ApiException
from sg_support import OPERATOR_USER, Kit, bind_operator_rbac, read_log, sample_bytes, start_operator
from support import REGISTRY_TOKEN

from servegraph.names import RESTARTED_AT_ANNOTATION
from servegraph.operator.rollout.store import store_name
from servegraph_testbed import WRITE_VERBS, Component, ControlPlane, KubeRayOperator
from servegraph_testbed.registry import RegistryServer
from servegraph_testbed.waiting import eventually

FINALIZER = "ray.io/rayservice-finalizer"


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane, kuberay: KubeRayOperator) -> Iterator[Component]:
    bind_operator_rbac(control_plane)
    component, _ = start_operator(control_plane, "servegraph-operator-suspend")
    yield component
    control_plane.unspawn(component)
    assert REGISTRY_TOKEN not in read_log(component.log_path)


@pytest.fixture
async def kit(
    operator: Component, admin_api: Any, namespace: str, registry: RegistryServer, ca_pem: str
) -> AsyncIterator[Kit]:
    k = Kit(admin_api, namespace, registry, ca_pem)
    await k.secret("registry-token", {"token": REGISTRY_TOKEN})
    await k.secret("registry-ca", {"ca.crt": ca_pem})
    yield k


async def _pending_cluster(kit: Kit, name: str, other_than: str = "") -> str:
    """The Ray cluster KubeRay is starting for the RayService (none ever becomes active here)."""

    async def named() -> str | None:
        rs = await kit.get_rs(name) or {}
        pending = ((rs.get("status") or {}).get("pendingServiceStatus") or {}).get("rayClusterName")
        return pending if pending and pending != other_than else None

    return await eventually(named, within=60, what=f"KubeRay naming a Ray cluster for {name} other than {other_than!r}")


async def _rayclusters(kit: Kit) -> list[dict[str, Any]]:
    items = await kit.custom.list_namespaced_custom_object("ray.io", "v1", kit.namespace, "rayclusters")
    return list(items["items"])


async def _serving_start(kit: Kit, name: str = "g", **ray_service: Any) -> dict[str, Any]:
    kit.registry.registry.publish(f"{kit.namespace}-{name}", sample_bytes("mini"))
    await kit.servegraph(name, f"{kit.namespace}-{name}")
    if ray_service:
        await kit.patch_sg(name, {"spec": {"rayService": ray_service}})
    await kit.wait_condition(name, "Applied", "True")
    rs = await kit.wait_rs(name, lambda rs: FINALIZER in (rs["metadata"].get("finalizers") or ()))
    await _pending_cluster(kit, name)
    await eventually(lambda: _rayclusters(kit), within=60, what="KubeRay creating the RayCluster")
    return rs


async def test_suspend_deletes_the_rayservice_and_resume_runs_the_same_version(
    kit: Kit, control_plane: ControlPlane
) -> None:
    rs = await _serving_start(kit)
    before = (await kit.get_sg("g"))["status"]
    graph = f"{kit.namespace}-g"
    downloads = kit.requests_for(graph)
    mark = control_plane.audit_log.offset()

    await kit.patch_sg("g", {"spec": {"suspend": True}})
    ready = await kit.wait_condition("g", "Ready", "False", "Suspended")
    version = before["graph"]["version"]
    assert ready["message"] == f"spec.suspend is true: version {version!r} is kept and runs again when it is false"

    async def gone() -> bool:
        return await kit.get_rs("g") is None and not await _rayclusters(kit)

    await eventually(gone, within=90, what="KubeRay removing the Ray cluster and the RayService")
    deletes = control_plane.audit_log.events(
        user=OPERATOR_USER, verbs={"delete"}, resource="rayservices", namespace=kit.namespace, since=mark
    )
    assert [e["objectRef"]["name"] for e in deletes] == ["g"], "one delete"
    assert deletes[0]["responseStatus"]["code"] in (200, 202)
    status = (await kit.get_sg("g"))["status"]
    assert status["graph"] == before["graph"] and status["history"] == before["history"]
    assert status["rollout"]["digest"] == before["rollout"]["digest"]
    assert status["rayServiceName"] == "g" and "applications" not in status and "pending" not in status
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions["Progressing"] == ("False", "Suspended") and conditions["Applied"] == ("True", "Suspended")
    kept = await kit.core.read_namespaced_config_map(store_name("g"), kit.namespace)
    assert before["rollout"]["digest"] in kept.binary_data, "the last good graph stays kept"
    events = [(e.type, e.reason) for e in (await kit.core.list_namespaced_event(kit.namespace)).items]
    assert ("Normal", "Suspended") in events

    # Suspended: the operator writes nothing more, however often it is asked to look.
    await kit.patch_sg("g", {"metadata": {"annotations": {"servegraph.io/refresh": "while-suspended"}}})
    await asyncio.sleep(3)
    assert kit.requests_for(graph) == downloads, "no download while suspended"
    quiet = control_plane.audit_log.offset()

    await kit.patch_sg("g", {"spec": {"suspend": False}})
    back = await kit.wait_rs("g")
    assert back["spec"]["serveConfigV2"] == rs["spec"]["serveConfigV2"], "the same version, rendered again"
    assert back["metadata"]["uid"] != rs["metadata"]["uid"], "a new RayService"
    await _pending_cluster(kit, "g")
    await kit.wait_condition("g", "Ready", "False", "WaitingForApplications")
    status = (await kit.get_sg("g"))["status"]
    assert status["history"] == before["history"], "a resume is no new rollout"
    assert status["graph"] == before["graph"]
    # The refresh asked for while suspended is honoured on resume: one conditional GET, same graph.
    requests = kit.requests_for(graph)[len(downloads) :]
    assert len(requests) == 1 and requests[0]["if_none_match"], requests
    writes = control_plane.audit_log.events(
        user=OPERATOR_USER, verbs=WRITE_VERBS, resource="rayservices", namespace=kit.namespace, since=quiet
    )
    assert [e["verb"] for e in writes] == ["patch"], "created again by one server-side apply"


async def test_restart_puts_the_annotation_in_every_pod_template_and_kuberay_starts_a_new_cluster(
    kit: Kit, control_plane: ControlPlane
) -> None:
    await _serving_start(kit)
    first = await _pending_cluster(kit, "g")

    result = await asyncio.to_thread(_cli, control_plane, "restart", "g", "-n", kit.namespace)
    assert result.returncode == 0, result.stderr
    value = (await kit.get_sg("g"))["metadata"]["annotations"][RESTARTED_AT_ANNOTATION]
    assert f"{RESTARTED_AT_ANNOTATION}={value}" in result.stdout

    def annotated(rs: dict[str, Any]) -> bool:
        cluster = rs["spec"]["rayClusterConfig"]
        groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
        return all(
            ((g["template"].get("metadata") or {}).get("annotations") or {}).get(RESTARTED_AT_ANNOTATION) == value
            for g in groups
        )

    await kit.wait_rs("g", annotated)
    second = await _pending_cluster(kit, "g", other_than=first)

    async def created() -> dict[str, Any] | None:
        rc = next((c for c in await _rayclusters(kit) if c["metadata"]["name"] == second), None)
        return rc

    rc = await eventually(created, within=60, what=f"RayCluster {second}")
    head = rc["spec"]["headGroupSpec"]["template"]["metadata"]["annotations"]
    assert head[RESTARTED_AT_ANNOTATION] == value, "KubeRay's new cluster carries it into its pods"
    events = [(e.type, e.reason) for e in (await kit.core.list_namespaced_event(kit.namespace)).items]
    assert ("Normal", "NewClusterUpgrade") in events or ("Normal", "Applied") in events


async def test_a_restart_with_upgrade_strategy_none_is_refused(kit: Kit, control_plane: ControlPlane) -> None:
    await _serving_start(kit, upgradeStrategy="None")
    result = await asyncio.to_thread(_cli, control_plane, "restart", "g", "-n", kit.namespace)
    assert result.returncode == 2 and "upgradeStrategy is None" in result.stderr, result.stderr
    assert RESTARTED_AT_ANNOTATION not in ((await kit.get_sg("g"))["metadata"].get("annotations") or {})

    # Set by hand: the operator refuses it, and the RayService stays as it is.
    await kit.patch_sg("g", {"metadata": {"annotations": {RESTARTED_AT_ANNOTATION: "2026-01-02T03:04:05Z"}}})
    applied = await kit.wait_condition("g", "Applied", "False", "RestartRefused")
    assert "upgradeStrategy None" in applied["message"]
    rs = await kit.get_rs("g")
    assert rs is not None
    template = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    assert RESTARTED_AT_ANNOTATION not in ((template.get("metadata") or {}).get("annotations") or {})

    # A ServeGraph that does not exist is said so (the client raises nothing for a 404 it reads raw).
    for command in ("restart", "rollback"):
        result = await asyncio.to_thread(_cli, control_plane, command, "missing", "-n", kit.namespace)
        assert result.returncode == 2 and "ServeGraph" in result.stderr and "not found" in result.stderr, result


async def test_the_crd_takes_spec_suspend_and_refuses_a_non_boolean(kit: Kit) -> None:
    kit.registry.registry.publish("x", sample_bytes("mini"))
    await kit.servegraph("s", "x")
    with pytest.raises(ApiException) as exc:
        await kit.patch_sg("s", {"spec": {"suspend": "yes"}})
    assert exc.value.status == 422 and "spec.suspend" in str(exc.value.body)


def _cli(cp: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    kubeconfig = str(cp.kubeconfig("admin"))
    return subprocess.run(
        [sys.executable, "-m", "servegraph.cli", *args, "--kubeconfig", kubeconfig],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
