"""`spec.expose` on the real API server with the Gateway API's CRDs (their schema and CEL rules
check every route the operator writes) and the operator bound by config/rbac only: the HTTPRoute
created, owned, left alone when nothing changed, repaired after an edit or a deletion by hand,
never one it does not control, deleted when spec.expose goes; the administrator's allowlist.
No Gateway implementation runs here (none accepts the routes): through Traefik, over TLS, with
Ray answering, in tests/node/test_expose.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes_asyncio.client.rest import ApiException
from sg_support import OPERATOR_USER, Kit, bind_operator_rbac, read_log, sample_bytes, start_operator
from support import REGISTRY_TOKEN

from servegraph_testbed import WRITE_VERBS, Component, ControlPlane, KubeRayOperator
from servegraph_testbed.registry import RegistryServer
from servegraph_testbed.waiting import eventually

GATEWAY_API = ("gateway.networking.k8s.io", "v1")
PUBLIC = {"gateway": {"namespace": "gateways", "name": "public"}, "hostnames": ["graph.example.test"]}


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane, kuberay: KubeRayOperator) -> Iterator[Component]:
    control_plane.install_crds(control_plane.binaries.gateway_crds)  # before the operator starts
    bind_operator_rbac(control_plane)
    flags = ["--allow-gateways", "gateways/public", "--allow-gateway-classes", "istio"]
    component, _ = start_operator(control_plane, "servegraph-operator-expose", *flags)
    yield component
    control_plane.unspawn(component)
    log = read_log(component.log_path)
    assert REGISTRY_TOKEN not in log
    assert "allowed for ServeGraphs: gateway classes istio; Gateways gateways/public" in log


@pytest.fixture
async def kit(
    operator: Component, admin_api: Any, namespace: str, registry: RegistryServer, ca_pem: str
) -> AsyncIterator[Kit]:
    k = Kit(admin_api, namespace, registry, ca_pem)
    await k.secret("registry-token", {"token": REGISTRY_TOKEN})
    await k.secret("registry-ca", {"ca.crt": ca_pem})
    yield k


async def _route(kit: Kit, name: str) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = await kit.custom.get_namespaced_custom_object(
            *GATEWAY_API, kit.namespace, "httproutes", name
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return obj


async def _wait_route(kit: Kit, name: str, check: Any = lambda r: True) -> dict[str, Any]:
    async def found() -> dict[str, Any] | None:
        route = await _route(kit, name)
        return route if route is not None and check(route) else None

    return await eventually(found, within=60, what=f"HTTPRoute {kit.namespace}/{name}")


async def _exposed(kit: Kit, name: str, expose: dict[str, Any]) -> dict[str, Any]:
    kit.registry.registry.publish(f"{kit.namespace}-{name}", sample_bytes("mini"))
    await kit.servegraph(name, f"{kit.namespace}-{name}")
    await kit.patch_sg(name, {"spec": {"expose": expose}})
    return await _wait_route(kit, name)


async def test_the_route_is_owned_kept_and_repaired_like_the_rayservice(kit: Kit, control_plane: ControlPlane) -> None:
    route = await _exposed(kit, "g", {**PUBLIC, "applications": {"sentiment": {"path": "/v1/mood"}}})
    sg = await kit.get_sg("g")
    (owner,) = route["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("ServeGraph", sg["metadata"]["uid"], True)
    assert route["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "gateways", "name": "public"}
    ]
    (rule,) = route["spec"]["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1/mood"}}]
    assert rule["backendRefs"] == [{"group": "", "kind": "Service", "name": "g-serve-svc", "port": 8000, "weight": 1}]
    assert [m["manager"] for m in route["metadata"]["managedFields"]] == ["servegraph-operator"]

    # Nothing changed: whatever makes the operator look again, no write.
    mark = control_plane.audit_log.offset()
    await kit.patch_sg("g", {"metadata": {"annotations": {"servegraph.io/refresh": "again"}}})
    await asyncio.sleep(3)

    def route_writes(since: int) -> list[str]:
        return [
            e["verb"]
            for e in control_plane.audit_log.events(
                user=OPERATOR_USER, verbs=WRITE_VERBS, resource="httproutes", namespace=kit.namespace, since=since
            )
        ]

    assert route_writes(mark) == []

    # An edit by hand (the hash annotation left as it was) and a deletion: both repaired.
    await kit.custom.patch_namespaced_custom_object(
        *GATEWAY_API,
        kit.namespace,
        "httproutes",
        "g",
        {"spec": {"hostnames": ["elsewhere.example.test"]}},
        _content_type="application/merge-patch+json",
    )
    await _wait_route(kit, "g", lambda r: r["spec"]["hostnames"] == ["graph.example.test"])
    uid = (await _route(kit, "g") or {})["metadata"]["uid"]
    await kit.custom.delete_namespaced_custom_object(*GATEWAY_API, kit.namespace, "httproutes", "g")
    await _wait_route(kit, "g", lambda r: r["metadata"]["uid"] != uid)

    # spec.expose removed: the route goes.
    mark = control_plane.audit_log.offset()
    await kit.patch_sg("g", {"spec": {"expose": None}})

    async def gone() -> bool:
        return await _route(kit, "g") is None

    await eventually(gone, within=60, what="the HTTPRoute deleted")
    assert route_writes(mark) == ["delete"]


async def test_a_gateway_or_class_not_allowed_is_refused_and_a_route_not_ours_left_alone(kit: Kit) -> None:
    kit.registry.registry.publish(f"{kit.namespace}-h", sample_bytes("mini"))
    await kit.servegraph("h", f"{kit.namespace}-h")
    await kit.patch_sg("h", {"spec": {"expose": {"gateway": {"namespace": "internet", "name": "edge"}}}})
    refused = await kit.wait_condition("h", "Fetched", "False", "InvalidSpec")
    assert refused["message"] == (
        "spec.expose.gateway: Gateway internet/edge is not allowed (allowed: gateways/public; "
        "the operator's --allow-gateways)"
    )
    assert await _route(kit, "h") is None
    traefik = {
        "upgradeStrategy": "NewClusterWithIncrementalUpgrade",
        "clusterUpgradeOptions": {"gatewayClassName": "traefik", "stepSizePercent": 10, "intervalSeconds": 30},
    }
    await kit.patch_sg("h", {"spec": {"expose": None, "rayService": traefik}})

    async def class_refused() -> bool:
        cond = await kit.condition("h", "Fetched") or {}
        return "gateway class 'traefik' is not allowed (allowed: istio" in cond.get("message", "")

    await eventually(class_refused, within=30, what="the gateway class refused")

    theirs = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "i"},
        "spec": {"parentRefs": [{"name": "theirs"}]},
    }
    await kit.custom.create_namespaced_custom_object(*GATEWAY_API, kit.namespace, "httproutes", theirs)
    kit.registry.registry.publish(f"{kit.namespace}-i", sample_bytes("mini"))
    await kit.servegraph("i", f"{kit.namespace}-i")
    await kit.patch_sg("i", {"spec": {"expose": PUBLIC}})
    conflict = await kit.wait_condition("i", "Applied", "False", "Conflict")
    assert conflict["message"].startswith(f"HTTPRoute {kit.namespace}/i exists and this ServeGraph does not control it")
    route = await _route(kit, "i")
    assert route is not None and route["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "theirs"}
    ]
