"""The administrator's pod policy (config/policy, a ValidatingAdmissionPolicy), on the real API
server: what a tenant may put into the pods its ServeGraphs (or its own Ray objects) make.

A tenant here is `restricted-user` with edit rights on ServeGraphs and Ray objects in its
namespace and nothing else. The policy is installed exactly as shipped, for this module only.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException
from sg_support import Kit, bind_operator_rbac, sample_bytes, start_operator
from support import REGISTRY_TOKEN, ROOT

from servegraph.v1 import graph_pb2
from servegraph_testbed import Component, ControlPlane
from servegraph_testbed.registry import RegistryServer
from servegraph_testbed.waiting import eventually

SYSTEM_NS = "servegraph-system"
ALLOWED = "ghcr.io/servegraph/servegraph-ray:0.1.0"
TENANT = "restricted-user"


@pytest.fixture(scope="module")
def policy(control_plane: ControlPlane) -> Iterator[None]:
    control_plane.kubectl("create", "namespace", SYSTEM_NS, check=False)
    control_plane.kubectl("apply", "-k", str(ROOT / "config" / "policy"))
    yield
    control_plane.kubectl("delete", "-k", str(ROOT / "config" / "policy"), "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane, policy: None) -> Iterator[Component]:
    bind_operator_rbac(control_plane)
    component, _ = start_operator(control_plane, "servegraph-operator-policy")
    yield component
    control_plane.unspawn(component)


@pytest.fixture
async def tenant(control_plane: ControlPlane, namespace: str, api_client_for: Any) -> Any:
    """An ApiClient as a tenant who may edit ServeGraphs and Ray objects in its namespace only."""
    role = f"""
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: tenant, namespace: {namespace}}}
rules:
- apiGroups: [servegraph.io]
  resources: [servegraphs]
  verbs: [get, list, create, update, patch, delete]
- apiGroups: [ray.io]
  resources: [rayservices, rayclusters, rayjobs]
  verbs: [get, list, create, update, patch, delete]
"""
    control_plane.kubectl("apply", "-f", "-", stdin=role)
    control_plane.kubectl("create", "rolebinding", "tenant", "-n", namespace, "--role=tenant", f"--user={TENANT}")
    return await api_client_for(TENANT)


@pytest.fixture
async def kit(
    operator: Component, admin_api: Any, namespace: str, registry: RegistryServer, ca_pem: str
) -> AsyncIterator[Kit]:
    k = Kit(admin_api, namespace, registry, ca_pem)
    await k.secret("registry-token", {"token": REGISTRY_TOKEN})
    await k.secret("registry-ca", {"ca.crt": ca_pem})
    yield k
    await k.custom.delete_collection_namespaced_custom_object("servegraph.io", "v1alpha1", namespace, "servegraphs")


def _servegraph(kit: Kit, name: str, ray_service: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "servegraph.io/v1alpha1",
        "kind": "ServeGraph",
        "metadata": {"name": name},
        "spec": {
            "source": {"url": kit.registry.url(name), "tokenSecretRef": {"name": "registry-token"}},
            "rayService": ray_service,
        },
    }


def _rayservice(name: str, image: str = ALLOWED, **pod: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "ray-head", "image": image}
    if "securityContext" in pod:
        container["securityContext"] = pod.pop("securityContext")
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": name},
        "spec": {
            "serveConfigV2": "applications: []\n",
            "rayClusterConfig": {
                "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [container], **pod}}}
            },
        },
    }


async def _refused(create: Any) -> str:
    with pytest.raises(ApiException) as err:
        await create()
    assert err.value.status in (400, 403, 422), err.value.body
    message: str = json.loads(err.value.body)["message"]  # the Status's message, its quotes unescaped
    return message


async def test_a_tenants_servegraph_with_a_disallowed_image_is_refused(kit: Kit, tenant: Any) -> None:
    custom = client.CustomObjectsApi(tenant)

    async def create(name: str, image: str) -> Any:
        body = _servegraph(kit, name, {"image": image})
        return await custom.create_namespaced_custom_object(
            "servegraph.io", "v1alpha1", kit.namespace, "servegraphs", body
        )

    async def active() -> bool:  # the policy takes effect a moment after it is created
        try:
            await create("probe", "evil.example.com/miner:1")
        except ApiException as exc:
            return "must start with one of" in str(exc.body)
        await custom.delete_namespaced_custom_object("servegraph.io", "v1alpha1", kit.namespace, "servegraphs", "probe")
        return False

    await eventually(active, within=30, what="the pod policy to take effect")
    message = await _refused(lambda: create("evil", "evil.example.com/miner:1"))
    assert "spec.rayService.image evil.example.com/miner:1 must start with one of: ghcr.io/servegraph/" in message
    assert "servegraph-pod-policy" in message
    await create("fine", ALLOWED)


async def test_a_servegraph_has_no_field_for_privileged_host_paths_or_host_network(kit: Kit, tenant: Any) -> None:
    custom = client.CustomObjectsApi(tenant)
    head = {
        "securityContext": {"privileged": True},
        "hostNetwork": True,
        "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
    }
    body = _servegraph(kit, "sneaky", {"image": ALLOWED, "head": head})
    message = await _refused(
        lambda: custom.create_namespaced_custom_object(
            "servegraph.io", "v1alpha1", kit.namespace, "servegraphs", copy.deepcopy(body), field_validation="Strict"
        )
    )
    assert 'unknown field "spec.rayService.head.hostNetwork"' in message
    created = await custom.create_namespaced_custom_object(
        "servegraph.io", "v1alpha1", kit.namespace, "servegraphs", body
    )  # without strict validation the fields are dropped: nothing of them can reach a pod
    assert created["spec"]["rayService"]["head"] == {}


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        ({"securityContext": {"privileged": True}}, "may not run privileged containers"),
        ({"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}, "may not add capabilities"),
        ({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}, "may not mount hostPath volumes"),
        ({"hostNetwork": True}, "may not use the node's network, PID or IPC namespace"),
        ({"hostPID": True}, "may not use the node's network, PID or IPC namespace"),
        ({"image": "evil.example.com/miner:1"}, "every container image must start with one of: ghcr.io/servegraph/"),
    ],
    ids=["privileged", "capabilities", "host-path", "host-network", "host-pid", "image"],
)
async def test_a_tenants_own_rayservice_is_held_to_the_same_policy(
    kit: Kit, tenant: Any, pod: dict[str, Any], expected: str
) -> None:
    custom = client.CustomObjectsApi(tenant)
    image = pod.pop("image", ALLOWED)
    body = _rayservice("mine", image, **pod)
    message = await _refused(
        lambda: custom.create_namespaced_custom_object("ray.io", "v1", kit.namespace, "rayservices", body)
    )
    assert expected in message
    await custom.create_namespaced_custom_object("ray.io", "v1", kit.namespace, "rayservices", _rayservice("allowed"))


async def test_a_graph_naming_a_disallowed_image_ends_in_apply_failed(kit: Kit) -> None:
    """The image can also come from the graph (cluster.image): the operator's apply is refused,
    and the ServeGraph says why; nothing runs."""
    graph = graph_pb2.Graph.FromString(sample_bytes("mini"))
    graph.cluster.image = "evil.example.com/miner:1"
    kit.registry.registry.publish("evil-graph", graph.SerializeToString())
    await kit.servegraph("evil-graph", "evil-graph")
    cond = await kit.wait_condition("evil-graph", "Applied", "False", "ApplyFailed")
    assert "every container image must start with one of: ghcr.io/servegraph/" in cond["message"]
    assert await kit.get_rs("evil-graph") is None
    await asyncio.sleep(0)
