"""The operator end to end: real kube-apiserver + etcd with RBAC, the real KubeRay
operator, a real HTTPS registry with a bearer check, and `servegraph run` as a
process bound only by the shipped ClusterRole."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException
from sg_support import (
    OPERATOR_USER,
    Kit,
    allowed,
    bind_operator_rbac,
    read_log,
    sample_bytes,
    start_operator,
)
from support import REGISTRY_TOKEN, SAMPLES

from servegraph.graph import load_graph
from servegraph.names import ConditionType
from servegraph.operator.conditions import Condition
from servegraph.operator.kuberay import NO_APPLICATION, POD_HINT, mirror_pending
from servegraph.operator.status.report import report
from servegraph.operator.values import GoodGraph, Observed, Outcome
from servegraph.render import serve_config_yaml
from servegraph.statustree.gather import gather
from servegraph.statustree.tree import render
from servegraph.v1 import graph_pb2
from servegraph_testbed import WRITE_VERBS, Component, ControlPlane, KubeRayOperator
from servegraph_testbed.registry import RegistryServer
from servegraph_testbed.waiting import eventually

ROTATED_TOKEN = "rotated-t0ken-0f-the-test"
WRONG_TOKEN = "wr0ng-t0ken-0f-the-test"


HEALTH: dict[str, int] = {}


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane) -> Iterator[Component]:
    bind_operator_rbac(control_plane)
    component, HEALTH["port"] = start_operator(control_plane)
    yield component
    control_plane.unspawn(component)
    log = read_log(component.log_path)
    for secret in (REGISTRY_TOKEN, ROTATED_TOKEN, WRONG_TOKEN):
        assert secret not in log, "a token reached the operator's log"


@pytest.fixture
async def kit(
    operator: Component, admin_api: Any, namespace: str, registry: RegistryServer, ca_pem: str
) -> AsyncIterator[Kit]:
    k = Kit(admin_api, namespace, registry, ca_pem)
    await k.secret("registry-token", {"token": REGISTRY_TOKEN + "\n"})
    await k.secret("registry-ca", {"ca.crt": ca_pem})
    yield k


def _operator_wrote_rayservice(cp: ControlPlane, namespace: str, since: int) -> list[Any]:
    """Writes to RayServices by the operator since `since`, from the API server's audit log.

    (Not the resourceVersion: KubeRay writes the RayService's status meanwhile.)
    """
    return cp.audit_log.events(
        user=OPERATOR_USER, verbs=WRITE_VERBS, resource="rayservices", namespace=namespace, since=since
    )


async def _applied(kit: Kit, name: str = "g", sample: str = "mini") -> tuple[dict[str, Any], dict[str, Any]]:
    kit.registry.registry.publish(sample, sample_bytes(sample))
    await kit.servegraph(name, sample)
    await kit.wait_condition(name, "Applied", "True")
    sg = await kit.get_sg(name)
    rs = await kit.wait_rs(sg["status"]["rayServiceName"])
    return sg, rs


async def test_create_renders_rayservice_and_kuberay_builds_its_cluster(kit: Kit, kuberay: KubeRayOperator) -> None:
    sg, rs = await _applied(kit, "hetero", "heterogeneous")
    graph = load_graph(SAMPLES / "heterogeneous.pb")
    assert rs["spec"]["serveConfigV2"] == serve_config_yaml(graph)
    groups = {g["groupName"]: g for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    assert set(groups) == {"cpu", "gpu"}
    assert groups["gpu"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    (owner,) = rs["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "ServeGraph",
        "hetero",
        sg["metadata"]["uid"],
        True,
    )
    assert rs["metadata"]["labels"]["servegraph.io/graph"] == "hetero"
    assert not sg["metadata"].get("finalizers"), "no finalizer may block deleting a ServeGraph"

    status = sg["status"]
    digest = hashlib.sha256(sample_bytes("heterogeneous")).hexdigest()
    assert status["graph"] == {
        "name": "heterogeneous",
        "version": "2026.11.1",
        "digest": f"sha256:{digest}",
        "shortDigest": digest[:12],
        "applications": 1,
        "nodes": 2,
    }
    assert status["observedGeneration"] == sg["metadata"]["generation"]
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Fetched": "True",
        "GraphValid": "True",
        "Applied": "True",
        "Ready": "False",
        "Progressing": "True",  # rolling out until every application runs (no Ray here)
    }

    async def cluster() -> dict[str, Any] | None:
        items = (await kit.custom.list_namespaced_custom_object("ray.io", "v1", kit.namespace, "rayclusters"))["items"]
        return next((c for c in items if c["metadata"]["ownerReferences"][0]["name"] == rs["metadata"]["name"]), None)

    rc = await eventually(cluster, within=60, what="KubeRay to create the RayCluster")
    assert [g["groupName"] for g in rc["spec"]["workerGroupSpecs"]] == ["cpu", "gpu"]

    events = [
        e for e in (await kit.core.list_namespaced_event(kit.namespace)).items if e.involved_object.name == "hetero"
    ]
    (applied,) = [e for e in events if (e.type, e.reason) == ("Normal", "Applied")]
    assert applied.message.startswith("created RayService hetero: graph heterogeneous version '2026.11.1' sha256 ")


async def test_spec_change_refresh_and_not_modified(kit: Kit, control_plane: ControlPlane) -> None:
    _, rs = await _applied(kit)
    name = rs["metadata"]["name"]

    await kit.patch_sg("g", {"spec": {"rayService": {"image": "example.com/ray:custom"}}})
    rs = await kit.wait_rs(
        name,
        lambda r: (
            r["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
            == "example.com/ray:custom"
        ),
    )

    kit.registry.registry.publish("mini", sample_bytes("complete"))
    await kit.patch_sg("g", {"metadata": {"annotations": {"servegraph.io/refresh": "1"}}})
    complete = serve_config_yaml(load_graph(SAMPLES / "complete.pb"))
    rs = await kit.wait_rs(name, lambda r: r["spec"]["serveConfigV2"] == complete)
    await kit.wait_condition("g", "Fetched", "True", "Downloaded")
    assert (await kit.get_sg("g"))["status"]["graph"]["name"] == "complete"

    requests_before = len(kit.registry.registry.requests)
    mark = control_plane.audit_log.offset()
    await kit.patch_sg("g", {"metadata": {"annotations": {"servegraph.io/refresh": "2"}}})
    await kit.wait_condition("g", "Fetched", "True", "NotModified")
    assert kit.registry.registry.requests[requests_before]["if_none_match"] is not None
    assert _operator_wrote_rayservice(control_plane, kit.namespace, mark) == [], "a 304 must not write the RayService"
    assert (await kit.get_rs(name) or {})["metadata"]["generation"] == rs["metadata"]["generation"]


async def test_token_rotation_and_wrong_token(kit: Kit, control_plane: ControlPlane) -> None:
    """Tokens are read when a download needs them, never watched: a registry that refuses the
    old token makes the operator read the Secret again in the same download."""
    _, rs = await _applied(kit)
    name = rs["metadata"]["name"]
    mark = control_plane.audit_log.offset()

    kit.registry.registry.token = ROTATED_TOKEN
    await kit.secret("registry-token", {"token": ROTATED_TOKEN})
    await kit.patch_sg("g", {"metadata": {"annotations": {"servegraph.io/refresh": "rotated"}}})
    await eventually(
        lambda: _async(kit.registry.registry.requests[-1]["authorization"] == f"Bearer {ROTATED_TOKEN}"),
        within=30,
        what="a fetch with the rotated token",
    )
    await kit.wait_condition("g", "Fetched", "True")

    kit.registry.registry.token = "a-token-nobody-has"
    await kit.secret("registry-token", {"token": WRONG_TOKEN})
    await kit.patch_sg("g", {"metadata": {"annotations": {"servegraph.io/refresh": "wrong"}}})
    cond = await kit.wait_condition("g", "Fetched", "False", "Forbidden")
    assert "HTTP 403" in cond["message"]
    assert _operator_wrote_rayservice(control_plane, kit.namespace, mark) == []
    assert (await kit.get_rs(name) or {})["spec"] == rs["spec"]
    status = await kit.get_sg("g")
    assert WRONG_TOKEN not in str(status) and ROTATED_TOKEN not in str(status)
    events = (await kit.core.list_namespaced_event(kit.namespace)).items
    assert any(e.reason == "FetchFailed" and e.type == "Warning" for e in events)
    assert not any(WRONG_TOKEN in (e.message or "") for e in events)


async def test_invalid_graph_never_touches_the_rayservice(kit: Kit, control_plane: ControlPlane) -> None:
    sg, rs = await _applied(kit)
    mark = control_plane.audit_log.offset()
    bad = graph_pb2.Graph()
    bad.ParseFromString(sample_bytes("mini"))
    bad.applications[0].nodes["sentiment"].deployment.kwargs["tokenizer"].node.id = "ghost"
    kit.registry.registry.publish("mini", bad.SerializeToString())
    await kit.patch_sg("g", {"metadata": {"annotations": {"servegraph.io/refresh": "bad"}}})
    cond = await kit.wait_condition("g", "GraphValid", "False", "InvalidGraph")
    assert 'node "sentiment"' in cond["message"] and "ghost" in cond["message"]
    assert _operator_wrote_rayservice(control_plane, kit.namespace, mark) == []
    assert (await kit.get_rs(rs["metadata"]["name"]) or {})["spec"] == rs["spec"]
    now = await kit.get_sg("g")
    assert now["status"]["graph"] == sg["status"]["graph"], "status keeps naming the last good graph"


@pytest.mark.parametrize(
    ("source", "reason"),
    [({"sha256": "0" * 64}, "DigestMismatch"), ({"maxBytes": 100}, "TooLarge")],
    ids=["sha256-pin", "oversize"],
)
async def test_rejected_downloads(kit: Kit, source: dict[str, Any], reason: str) -> None:
    kit.registry.registry.publish("mini", sample_bytes("mini"))
    await kit.servegraph("g", "mini", **source)
    await kit.wait_condition("g", "Fetched", "False", reason)
    await kit.wait_condition("g", "Applied", "False", "NoValidGraph")
    assert await kit.get_rs("g") is None


async def test_drift_is_repaired(kit: Kit) -> None:
    _, rs = await _applied(kit)
    name = rs["metadata"]["name"]
    await kit.custom.delete_namespaced_custom_object("ray.io", "v1", kit.namespace, "rayservices", name)
    recreated = await kit.wait_rs(name, lambda r: r["metadata"]["uid"] != rs["metadata"]["uid"])
    assert recreated["spec"]["serveConfigV2"] == rs["spec"]["serveConfigV2"]

    await kit.custom.patch_namespaced_custom_object(
        "ray.io",
        "v1",
        kit.namespace,
        "rayservices",
        name,
        {"spec": {"serveConfigV2": "applications: []\n"}},
        _content_type="application/merge-patch+json",
    )
    await kit.wait_rs(name, lambda r: r["spec"]["serveConfigV2"] == rs["spec"]["serveConfigV2"])


async def test_status_mirrors_applications_and_ready_needs_all_running(kit: Kit) -> None:
    _, rs = await _applied(kit)
    name = rs["metadata"]["name"]

    async def set_app(status: str, message: str = "") -> None:
        patch = {
            "status": {
                "activeServiceStatus": {
                    "applicationStatuses": {
                        "sentiment": {
                            "status": status,
                            "message": message,
                            "serveDeploymentStatuses": {
                                "sentiment": {"status": "UNHEALTHY" if message else "HEALTHY"},
                                "tokenizer": {"status": "HEALTHY"},
                            },
                        }
                    }
                }
            }
        }
        await kit.custom.patch_namespaced_custom_object_status(
            "ray.io", "v1", kit.namespace, "rayservices", name, patch, _content_type="application/merge-patch+json"
        )

    await set_app("DEPLOY_FAILED", "replica crashed")
    cond = await kit.wait_condition("g", "Ready", "False", "ApplicationsNotRunning")
    assert cond["message"] == 'application "sentiment": replica crashed; sentiment: DEPLOY_FAILED'
    apps = (await kit.get_sg("g"))["status"]["applications"]
    assert apps["sentiment"]["message"] == "replica crashed"
    assert apps["sentiment"]["deployments"]["sentiment"] == {"status": "UNHEALTHY"}

    await set_app("RUNNING")
    await kit.wait_condition("g", "Ready", "True", "AllApplicationsRunning")


async def test_steady_state_makes_no_writes(kit: Kit, control_plane: ControlPlane) -> None:
    await _applied(kit, "a")
    await _applied(kit, "b", "heterogeneous")
    audit = control_plane.audit_log

    # (Only this namespace: elsewhere other tests' rollouts, which never become Ready
    # without Ray, reach their progress deadline and say so.)
    # Settled: 3 s without a write in the namespace by anyone, KubeRay included. The operator's
    # writes answer KubeRay's status writes, and on a starved machine one of those can come
    # later than 3 s after the operator's last.
    async def quiet() -> bool:
        mark = audit.offset()
        await asyncio.sleep(3)
        return not audit.events(verbs=WRITE_VERBS, since=mark, namespace=kit.namespace)

    await eventually(quiet, within=60, what="the operator to settle")
    mark = audit.offset()
    await asyncio.sleep(10)
    writes = audit.events(user=OPERATOR_USER, verbs=WRITE_VERBS, since=mark, namespace=kit.namespace)
    assert writes == [], [(e["verb"], e["objectRef"]) for e in writes]
    # Other tests' ServeGraphs, left failing on purpose, retry their downloads meanwhile.
    reads = audit.events(user=OPERATOR_USER, since=mark, namespace=kit.namespace)
    assert all(e["verb"] in {"watch", "list"} for e in reads), [(e["verb"], e.get("requestURI")) for e in reads][:5]


def test_operator_identity_has_only_the_shipped_permissions(operator: Component, control_plane: ControlPlane) -> None:
    def can(*args: str) -> bool:
        out = control_plane.kubectl("auth", "can-i", *args, identity=OPERATOR_USER, check=False)
        return out.stdout.strip() == "yes"

    assert can("patch", "rayservices.ray.io") and can("patch", "servegraphs.servegraph.io", "--subresource=status")
    assert can("delete", "rayservices.ray.io")  # spec.suspend; no other delete
    assert not can("delete", "rayclusters.ray.io") and not can("delete", "configmaps")
    assert not can("delete", "servegraphs.servegraph.io")
    assert not can("update", "servegraphs.servegraph.io")
    assert not can("list", "pods")
    assert not can("create", "secrets")
    assert can("get", "secrets") and not can("list", "secrets") and not can("watch", "secrets")
    assert not can("get", "rayclusters.ray.io")


async def _async(value: Any) -> Any:
    return value


async def test_deleted_servegraph_is_forgotten(kit: Kit) -> None:
    await _applied(kit)
    await kit.custom.delete_namespaced_custom_object("servegraph.io", "v1alpha1", kit.namespace, "servegraphs", "g")

    async def gone() -> bool:
        try:
            await kit.get_sg("g")
        except ApiException as exc:
            return exc.status == 404
        return False

    await eventually(gone, within=30, what="the ServeGraph to be deleted without waiting for the operator")
    rs = await kit.get_rs("g")
    assert rs is not None and rs["metadata"]["ownerReferences"][0]["name"] == "g"  # GC (not run here) removes it
    assert yaml.safe_load(rs["spec"]["serveConfigV2"])["applications"][0]["name"] == "sentiment"


async def test_poll_interval_picks_up_new_content(kit: Kit) -> None:
    kit.registry.registry.publish("mini", sample_bytes("mini"))
    await kit.servegraph("polled", "mini", pollInterval="10s")
    await kit.wait_condition("polled", "Applied", "True")
    kit.registry.registry.publish("mini", sample_bytes("complete"))  # no trigger but the poll
    complete = serve_config_yaml(load_graph(SAMPLES / "complete.pb"))
    await kit.wait_rs("polled", lambda r: r["spec"]["serveConfigV2"] == complete, within=60)


async def test_metrics_endpoint(kit: Kit) -> None:
    await _applied(kit)
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{HEALTH['port']}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    samples = {
        line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line and not line.startswith("#")
    }
    assert samples['servegraph_reconciles_total{result="success"}'] >= 1
    assert samples['servegraph_fetch_responses_total{code="200"}'] >= 1
    assert samples["servegraph_fetch_bytes_total"] >= len(sample_bytes("mini"))
    assert samples['servegraph_reconcile_duration_seconds_count{result="success"}'] >= 1
    assert samples['servegraph_fetch_duration_seconds_count{code="200"}'] >= 1
    assert samples['servegraph_servegraphs{condition="Applied",status="True"}'] >= 1
    # The real watch brought the operator's own status writes and applies back, and they went
    # no further than their decoding (operator/run/echoes.py).
    assert samples['servegraph_watch_echoes_dropped_total{kind="servegraph"}'] >= 1
    assert samples['servegraph_watch_echoes_dropped_total{kind="rayservice"}'] >= 1
    assert samples["process_cpu_seconds_total"] > 0 and samples["process_resident_memory_bytes"] > 2**20
    assert 'servegraph_gc_collections_total{generation="0"}' in samples


async def test_a_first_cluster_that_never_starts_is_named_and_servegraph_status_says_why(
    kit: Kit, kuberay: KubeRayOperator, control_plane: ControlPlane
) -> None:
    """The real KubeRay's report: with no kubelet here its first Ray cluster never starts. The
    ServeGraph names that cluster and where to look, instead of "no application status yet";
    `servegraph status` reads the RayCluster and its pods, fresh, with the caller's credentials."""
    _, rs = await _applied(kit)

    async def starting() -> dict[str, Any] | None:
        status: dict[str, Any] = (await kit.get_sg("g")).get("status") or {}
        return status if (status.get("pending") or {}).get("rayClusterName") else None

    status = await eventually(starting, within=60, what="KubeRay's pending Ray cluster in the status")
    name = status["pending"]["rayClusterName"]
    rc = await eventually(  # KubeRay names the cluster in the status before it creates it
        lambda: kit.custom.get_namespaced_custom_object("ray.io", "v1", kit.namespace, "rayclusters", name),
        within=60,
        what=f"RayCluster {name}",
    )
    assert rc["metadata"]["ownerReferences"][0]["uid"] == rs["metadata"]["uid"], "the cluster KubeRay made for it"
    assert status["pending"] == {"rayClusterName": name, "applications": {}}
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["Ready"]["reason"], conditions["Ready"]["message"]) == (
        "WaitingForApplications",
        f"KubeRay is starting Ray cluster {name}: {NO_APPLICATION}; {POD_HINT}",
    )
    assert conditions["Progressing"]["message"].endswith(f"; Ray cluster {name}: {NO_APPLICATION}; {POD_HINT}")

    # `servegraph status` as admin: KubeRay's RayCluster as it is now, and its pods, none scheduled.
    async def status_text(identity: str = "admin") -> tuple[Any, str]:
        kubeconfig = str(control_plane.kubeconfig(identity))
        snap = await gather("g", kit.namespace, kubeconfig=kubeconfig, live_replicas=False)
        return snap, render(snap, datetime.now(UTC))

    async def head_not_ready() -> tuple[Any, str] | None:
        snap, text = await status_text()
        return (snap, text) if "(head pod not ready, 0 of 1 workers ready)" in text else None

    snap, text = await eventually(head_not_ready, within=60, what="KubeRay's RayCluster status read by the command")
    assert f"Starting:      Ray cluster {name} (head pod not ready, 0 of 1 workers ready), not serving yet\n" in text
    assert {p["metadata"]["labels"]["ray.io/cluster"] for p in snap.pods} == {name}
    roles = sorted(p["metadata"]["labels"]["ray.io/node-type"] for p in snap.pods)
    assert roles == ["head", "worker"], roles
    (head,) = [p["metadata"]["name"] for p in snap.pods if p["metadata"]["labels"]["ray.io/node-type"] == "head"]
    assert f"\n  {head} (head)  Pending  no scheduling decision yet\n" in text, text
    assert "(worker cpu)  Pending  no scheduling decision yet\n" in text, text

    # Standing in for kube-scheduler, which this tier does not run (the node tier has the real one):
    # its verdict written to the head pod's status as the scheduler writes it, read back by the command.
    verdict = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: not eligible."
    scheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": verdict}
    await kit.core.patch_namespaced_pod_status(
        head, kit.namespace, {"status": {"conditions": [scheduled]}}, _content_type="application/merge-patch+json"
    )
    _, text = await status_text()
    assert f"\n  {head} (head)  Pending  not scheduled: Unschedulable: {verdict}\n" in text, text

    # A caller who may read all but pods gets the tree and a line saying so; nothing fails.
    readable = [("servegraph.io", "servegraphs"), ("ray.io", "rayservices"), ("ray.io", "rayclusters")]
    await _grant(kit, control_plane, "restricted-user", [(g, r, "get") for g, r in readable] + [("", "events", "list")])
    snap, text = await status_text("restricted-user")
    forbidden = 'the API server answered HTTP 403: pods is forbidden: User "restricted-user" cannot list'
    assert snap.pods == [] and (snap.ray_note or "").startswith(forbidden), snap.ray_note
    assert f"Ray pods:      not read: {forbidden}" in text
    assert f"Starting:      Ray cluster {name} (head pod not ready, 0 of 1 workers ready)" in text


async def _grant(kit: Kit, cp: ControlPlane, user: str, rules: list[tuple[str, str, str]]) -> None:
    """A Role in the test's namespace with these (group, resource, verb) rules, bound to `user`,
    once the authorizer answers with it: it learns new Roles and bindings from its informers a
    moment after they are stored, and a read in that moment is forbidden (seen once in 4)."""
    rbac = client.RbacAuthorizationV1Api(kit.api)
    role = {
        "metadata": {"name": f"{user}-status"},
        "rules": [{"apiGroups": [g], "resources": [r], "verbs": [v]} for g, r, v in rules],
    }
    await rbac.create_namespaced_role(kit.namespace, role)
    binding = {
        "metadata": {"name": f"{user}-status"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{user}-status"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    await rbac.create_namespaced_role_binding(kit.namespace, binding)

    async def in_effect() -> bool:
        return all([await asyncio.to_thread(allowed, cp, user, kit.namespace, v, g, r) for g, r, v in rules])

    await eventually(in_effect, within=30, interval=0.1, what=f"{user}'s Role in effect")


async def test_the_crd_keeps_a_stuck_rollouts_status_whole(
    kit: Kit, api_client_for: Callable[..., Awaitable[Any]]
) -> None:
    """The status the operator writes for a rollout stuck in its pending cluster, through the real
    CRD schema: nothing pruned, nothing refused. The RayService status it is computed from is written
    here as KubeRay would write it once Ray Serve reports (no Ray runs on this tier): the schema is
    what is tested, not serving."""
    unscheduled = (
        "Deployment 'tokenizer' in application 'sentiment' has 1 replicas that have taken more than 30s to be "
        'scheduled. Resources required for each replica: {"CPU": 0.1}, total resources available: {}.'
    )
    long = "Replicas wait for: " + ", ".join(f'"node-{i}": {{"CPU": 4}}' for i in range(200)) + "."
    kuberay_status = {
        "pendingServiceStatus": {
            "rayClusterName": "g-x7k2p",
            "applicationStatuses": {
                "sentiment": {
                    "status": "DEPLOYING",
                    "message": long,
                    "serveDeploymentStatuses": {
                        "sentiment": {"status": "HEALTHY"},
                        "tokenizer": {"status": "UPDATING", "message": unscheduled},
                    },
                }
            },
        }
    }
    pending = mirror_pending({"status": kuberay_status})
    assert pending is not None and len(pending["applications"]["sentiment"]["message"]) == 1024
    good = GoodGraph.of(load_graph(SAMPLES / "mini.pb"), hashlib.sha256(sample_bytes("mini")).hexdigest(), b"")
    applied = Condition(ConditionType.APPLIED, True, "UpToDate", "RayService g matches the graph and spec")
    status = report(
        {}, 1, Observed(Outcome(applied=applied), good, None, "g", {}, pending=pending), "2026-01-01T00:00:00Z"
    ).status
    assert 'deployment "tokenizer": Deployment' in next(
        c["message"] for c in status["conditions"] if c["type"] == "Ready"
    )

    # (The source 404s: whatever the operator writes next, the answer to this write is what the CRD kept.)
    created = await kit.servegraph("g", "never-published")
    ops = [
        {"op": "test", "path": "/metadata/uid", "value": created["metadata"]["uid"]},
        {"op": "add", "path": "/status", "value": status},
    ]
    as_operator = client.CustomObjectsApi(await api_client_for(OPERATOR_USER))
    written = await as_operator.patch_namespaced_custom_object_status(
        "servegraph.io", "v1alpha1", kit.namespace, "servegraphs", "g", ops, _content_type="application/json-patch+json"
    )
    assert written["status"] == json.loads(json.dumps(status))
