"""Suspend, resume and restart against the real API server and the real KubeRay.

No kubelet runs here, so no Ray pod starts: what is checked is what the API server and
KubeRay do with what the operator writes. KubeRay 1.7 has a suspend of its own, which the
operator finds in its CRD at start: suspending sets the RayService's `spec.suspend` (KubeRay
deletes its RayCluster and says Suspended) and keeps the ServeGraph's status and kept graphs;
resuming drops it again, without a download, and KubeRay starts a new cluster; `servegraph
restart` puts the annotation into every pod template and KubeRay prepares a new cluster for
it. KubeRay 1.6's (the RayService deleted): tests/integration/test_kuberay_previous.py. With Ray
pods answering requests: tests/node/test_suspend.py.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client.rest import ApiException
from sg_support import OPERATOR_USER, Kit, bind_operator_rbac, read_log, sample_bytes, start_operator
from support import REGISTRY_TOKEN

from servegraph.names import RESTARTED_AT_ANNOTATION
from servegraph.operator.rollout.store import store_name
from servegraph.v1 import graph_pb2
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


async def test_suspend_sets_kuberays_own_suspend_and_resume_runs_the_same_version(
    kit: Kit, control_plane: ControlPlane, operator: Component
) -> None:
    assert "KubeRay's RayService: spec.suspend yes" in read_log(operator.log_path), "read from its CRD at start"
    rs = await _serving_start(kit)
    before = (await kit.get_sg("g"))["status"]
    graph = f"{kit.namespace}-g"
    downloads = kit.requests_for(graph)
    mark = control_plane.audit_log.offset()

    await kit.patch_sg("g", {"spec": {"suspend": True}})
    ready = await kit.wait_condition("g", "Ready", "False", "Suspended")
    version = before["graph"]["version"]
    assert ready["message"] == f"spec.suspend is true: version {version!r} is kept and runs again when it is false"

    def suspended(rs: dict[str, Any]) -> bool:
        said = {c["type"]: c["status"] for c in (rs.get("status") or {}).get("conditions") or []}
        return rs["spec"].get("suspend") is True and said.get("Suspended") == "True"

    kept = await kit.wait_rs("g", suspended)
    assert kept["metadata"]["uid"] == rs["metadata"]["uid"], "the RayService is kept"
    assert kept["spec"]["serveConfigV2"] == rs["spec"]["serveConfigV2"]

    async def clusters_gone() -> bool:
        return not await _rayclusters(kit)

    await eventually(clusters_gone, within=90, what="KubeRay deleting the RayCluster")
    # Applied says Suspended from the first write; its message follows KubeRay's status, which
    # the operator may not have read yet when the cluster is gone (a clean-clone run saw
    # "deletes its Ray cluster (Suspending)" at this point once).
    gone = "RayService g has spec.suspend: KubeRay deleted its Ray cluster (Suspended)"
    await kit.wait_condition("g", "Applied", "True", "Suspended", message=gone)
    writes = control_plane.audit_log.events(
        user=OPERATOR_USER, verbs=WRITE_VERBS, resource="rayservices", namespace=kit.namespace, since=mark
    )
    assert [e["verb"] for e in writes] == ["patch"], "one server-side apply, no delete"
    status = (await kit.get_sg("g"))["status"]
    assert status["graph"] == before["graph"] and status["history"] == before["history"]
    assert status["rollout"]["digest"] == before["rollout"]["digest"]
    assert status["rayServiceName"] == "g" and "applications" not in status and "pending" not in status
    assert (await kit.core.read_namespaced_config_map(store_name("g"), kit.namespace)).binary_data
    events = [(e.type, e.reason, e.message) for e in (await kit.core.list_namespaced_event(kit.namespace)).items]
    said = f"set spec.suspend on RayService g (spec.suspend); version {version!r} is kept and runs again on resume"
    assert ("Normal", "Suspended", said) in events

    # Suspended: the operator writes nothing more, however often it is asked to look.
    await kit.patch_sg("g", {"metadata": {"annotations": {"servegraph.io/refresh": "while-suspended"}}})
    await asyncio.sleep(3)
    assert kit.requests_for(graph) == downloads, "no download while suspended"
    quiet = control_plane.audit_log.offset()

    await kit.patch_sg("g", {"spec": {"suspend": False}})
    back = await kit.wait_rs("g", lambda rs: "suspend" not in rs["spec"])
    assert back["spec"]["serveConfigV2"] == rs["spec"]["serveConfigV2"], "the same version"
    assert back["metadata"]["uid"] == rs["metadata"]["uid"], "the same RayService, resumed"
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
    assert [e["verb"] for e in writes] == ["patch"], "resumed by one server-side apply"


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


async def test_diff_against_the_live_servegraph_and_a_server_dry_run(
    kit: Kit, control_plane: ControlPlane, tmp_path: Path
) -> None:
    """Issue 47 on the real API server: `diff sg/NAME` reads the live RayService in the kubeconfig
    context's namespace (no -n) and exits as a CI gate (0 same graph, 0 a version bump alone, 1 a
    change); `restart --dry-run=server` has the API server accept the patch and changes nothing."""
    await _serving_start(kit)
    kubeconfig = yaml.safe_load(control_plane.kubeconfig("admin").read_text())
    for context in kubeconfig["contexts"]:
        context["context"]["namespace"] = kit.namespace
    scoped = tmp_path / "kubeconfig"
    scoped.write_text(yaml.safe_dump(kubeconfig))

    def diff(graph: graph_pb2.Graph) -> subprocess.CompletedProcess[str]:
        path = tmp_path / "new.pb"
        path.write_bytes(graph.SerializeToString())
        argv = [sys.executable, "-m", "servegraph.cli", "diff", "sg/g", str(path), "--kubeconfig", str(scoped)]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)

    mini = graph_pb2.Graph.FromString(sample_bytes("mini"))
    same = await asyncio.to_thread(diff, mini)
    assert (same.returncode, same.stdout) == (0, "no change\n"), same.stderr
    mini.version = "2"
    bumped = await asyncio.to_thread(diff, mini)
    assert bumped.returncode == 0 and bumped.stdout.startswith("no change: graph version '1' -> '2'"), bumped
    mini.applications[0].nodes["sentiment"].user_config["threshold"] = 0.9
    changed = await asyncio.to_thread(diff, mini)
    assert changed.returncode == 1, changed.stderr
    assert "upgrade: ServeConfigInPlace" in changed.stdout and "deployment sentiment: user_config" in changed.stdout

    dry = await asyncio.to_thread(_cli, control_plane, "restart", "g", "-n", kit.namespace, "--dry-run=server")
    assert dry.returncode == 0 and "dry run, the API server accepted it, nothing changed" in dry.stdout, dry.stderr
    assert RESTARTED_AT_ANNOTATION not in ((await kit.get_sg("g"))["metadata"].get("annotations") or {})
