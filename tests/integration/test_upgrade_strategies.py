"""Every upgrade strategy the CRD offers renders a RayService the real KubeRay accepts,
and the CRD refuses incomplete ones before they reach it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes_asyncio.client.rest import ApiException
from sg_support import GROUP, PLURAL, VERSION, Kit, bind_operator_rbac, read_log, sample_bytes, start_operator
from support import REGISTRY_TOKEN

from servegraph_testbed import Component, ControlPlane, KubeRayOperator
from servegraph_testbed.registry import RegistryServer
from servegraph_testbed.waiting import eventually

INCREMENTAL = {
    "upgradeStrategy": "NewClusterWithIncrementalUpgrade",
    "clusterUpgradeOptions": {
        "gatewayClassName": "istio",
        "maxSurgePercent": 50,
        "stepSizePercent": 25,
        "intervalSeconds": 30,
    },
}


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane, kuberay: KubeRayOperator) -> Iterator[Component]:
    # KubeRay's incremental upgrade creates a Gateway and an HTTPRoute for the RayService.
    control_plane.install_crds(control_plane.binaries.gateway_crds)
    bind_operator_rbac(control_plane)
    # The class KubeRay creates a Gateway of must be one the administrator allows (operator/gateways.py).
    component, _ = start_operator(control_plane, "servegraph-operator-strategies", "--allow-gateway-classes", "istio")
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


async def _accepted(kit: Kit, name: str, ray_service: dict[str, Any]) -> dict[str, Any]:
    kit.registry.registry.publish(f"{kit.namespace}-{name}", sample_bytes("mini"))
    await kit.servegraph(name, f"{kit.namespace}-{name}")
    await kit.patch_sg(name, {"spec": {"rayService": ray_service}})

    async def cluster_created() -> dict[str, Any] | None:
        rs = await kit.get_rs(name)
        if rs is None or (rs["spec"].get("upgradeStrategy") or {}).get("type") != ray_service["upgradeStrategy"]:
            return None
        conditions = (rs.get("status") or {}).get("conditions") or []
        refused = [c for c in conditions if c.get("reason") == "ValidationFailed"]
        assert not refused, f"KubeRay refused {ray_service['upgradeStrategy']}: {refused}"
        status = rs.get("status") or {}
        created = status.get("pendingServiceStatus", {}).get("rayClusterName") or status.get(
            "activeServiceStatus", {}
        ).get("rayClusterName")
        return rs if created else None

    return await eventually(cluster_created, within=60, what=f"KubeRay accepting {name}")


@pytest.mark.parametrize(
    "ray_service",
    [{"upgradeStrategy": "NewCluster"}, {"upgradeStrategy": "None"}, INCREMENTAL],
    ids=["NewCluster", "None", "NewClusterWithIncrementalUpgrade"],
)
async def test_kuberay_accepts_each_strategy(kit: Kit, ray_service: dict[str, Any]) -> None:
    rs = await _accepted(kit, "g", ray_service)
    strategy = rs["spec"]["upgradeStrategy"]
    assert strategy["type"] == ray_service["upgradeStrategy"]
    if "clusterUpgradeOptions" in ray_service:
        assert strategy["clusterUpgradeOptions"] == ray_service["clusterUpgradeOptions"]
        assert rs["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True  # KubeRay requires it

        # KubeRay 1.7 runs it as shipped (its gate on by default): it creates the Gateway of
        # the class asked for, before any cluster serves (1.6.2 does not: test_kuberay_previous).
        async def gateway() -> dict[str, Any] | None:
            try:
                obj: dict[str, Any] = await kit.custom.get_namespaced_custom_object(
                    "gateway.networking.k8s.io", "v1", kit.namespace, "gateways", "g-gateway"
                )
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
            return obj

        gw = await eventually(gateway, within=60, what="KubeRay's Gateway for the RayService")
        assert gw["spec"]["gatewayClassName"] == ray_service["clusterUpgradeOptions"]["gatewayClassName"]
        assert [(listener["protocol"], listener["port"]) for listener in gw["spec"]["listeners"]] == [("HTTP", 80)]


async def test_kuberay_refuses_incremental_without_its_options(kit: Kit) -> None:
    """The control: what the CRD's CEL rule keeps from ever being rendered, KubeRay rejects."""
    body = {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": "by-hand"},
        "spec": {
            "upgradeStrategy": {"type": "NewClusterWithIncrementalUpgrade"},
            "rayClusterConfig": {
                "headGroupSpec": {
                    "rayStartParams": {},
                    "template": {"spec": {"containers": [{"name": "ray-head", "image": "ray:1"}]}},
                }
            },
        },
    }
    await kit.custom.create_namespaced_custom_object("ray.io", "v1", kit.namespace, "rayservices", body)

    async def refused() -> dict[str, Any] | None:
        rs = await kit.get_rs("by-hand")
        conditions = ((rs or {}).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c.get("reason") == "ValidationFailed"), None)

    cond = await eventually(refused, within=60, what="KubeRay's ValidationFailed")
    assert "ClusterUpgradeOptions are required" in cond["message"] or "Autoscaler" in cond["message"]


@pytest.mark.parametrize(
    ("ray_service", "message"),
    [
        ({"upgradeStrategy": "NewClusterWithIncrementalUpgrade"}, "clusterUpgradeOptions are required with"),
        ({"upgradeStrategy": "NewCluster", "clusterUpgradeOptions": INCREMENTAL["clusterUpgradeOptions"]}, "only with"),
        ({**INCREMENTAL, "clusterUpgradeOptions": {"gatewayClassName": "istio"}}, "stepSizePercent"),
    ],
)
async def test_the_crd_refuses_incomplete_strategies(kit: Kit, ray_service: dict[str, Any], message: str) -> None:
    await _refused(kit, {"rayService": ray_service}, message)


async def _refused(kit: Kit, spec: dict[str, Any], message: str) -> None:
    """The API server refuses a ServeGraph with `spec` (beside a valid source), naming why."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ServeGraph",
        "metadata": {"name": "bad"},
        "spec": {"source": {"url": "https://r/g", "tokenSecretRef": {"name": "t"}}, **spec},
    }
    with pytest.raises(ApiException) as err:
        await kit.custom.create_namespaced_custom_object(GROUP, VERSION, kit.namespace, PLURAL, body)
    assert err.value.status == 422 and message in err.value.body


@pytest.mark.parametrize(
    ("rollout", "message"),
    [
        ({"pin": {}}, "set exactly one of digest and version"),
        ({"pin": {"digest": "a" * 64, "version": "1"}}, "set exactly one of digest and version"),
        ({"progressDeadline": "5s"}, "progressDeadline must be between 30s and 24h"),
        ({"historyLimit": 0}, "historyLimit"),
    ],
)
async def test_the_crd_refuses_bad_rollout_settings(kit: Kit, rollout: dict[str, Any], message: str) -> None:
    await _refused(kit, {"rollout": rollout}, message)
