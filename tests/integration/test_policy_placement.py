"""Placement per worker group, held by the administrator (issue 22, item 4), on the real API
server: the ServeGraph CRD's schema for `workerGroups`, and the pod policy's placement rules
(config/policy: allowedPriorityClasses, reservedTaints, reservedNodeLabels) for a tenant's
ServeGraphs, its own RayServices and the placement a graph's worker-group hints ask for.

A tenant here is `restricted-user` with edit rights on ServeGraphs and Ray objects in its
namespace only. The policy is installed exactly as shipped, for this module only; tests that
need reservations set its parameters as an administrator would, and put them back.
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException
from sg_support import Kit, bind_operator_rbac, pod_policy, sample_bytes, set_pod_policy, start_operator, tenant_api
from support import REGISTRY_TOKEN, ROOT

from servegraph.v1 import graph_pb2
from servegraph_testbed import Component, ControlPlane
from servegraph_testbed.registry import RegistryServer
from servegraph_testbed.waiting import eventually

ALLOWED = "ghcr.io/servegraph/servegraph-ray:0.1.0"
TAINT = "dedicated.example.com/reserved"
LABEL = "pool.example.com/reserved"
RESERVING = {"allowedPriorityClasses": "serving, serving-gpu", "reservedTaints": TAINT, "reservedNodeLabels": LABEL}
SHIPPED = {"allowedPriorityClasses": "", "reservedTaints": "", "reservedNodeLabels": ""}


@pytest.fixture(scope="module")
def policy(control_plane: ControlPlane) -> Iterator[None]:
    with pod_policy(control_plane):
        yield


def _set_params(control_plane: ControlPlane, data: dict[str, str]) -> None:
    set_pod_policy(control_plane, **data)


@pytest.fixture
async def tenant(control_plane: ControlPlane, policy: None, namespace: str, api_client_for: Any) -> Any:
    """A CustomObjectsApi as a tenant who may edit ServeGraphs and Ray objects in its namespace only."""
    return client.CustomObjectsApi(await tenant_api(control_plane, namespace, api_client_for))


def _servegraph(name: str, ray_service: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "servegraph.io/v1alpha1",
        "kind": "ServeGraph",
        "metadata": {"name": name},
        "spec": {
            "source": {"url": f"https://registry.example.com/v1/graphs/{name}", "tokenSecretRef": {"name": "t"}},
            "rayService": {"image": ALLOWED, **ray_service},
        },
    }


def _rayservice(name: str, worker: dict[str, Any] | None = None, head: dict[str, Any] | None = None) -> dict[str, Any]:
    def pod(container: str, extra: dict[str, Any] | None) -> dict[str, Any]:
        return {"spec": {"containers": [{"name": container, "image": ALLOWED}], **(extra or {})}}

    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": name},
        "spec": {
            "serveConfigV2": "applications: []\n",
            "rayClusterConfig": {
                "headGroupSpec": {"rayStartParams": {}, "template": pod("ray-head", head)},
                "workerGroupSpecs": [
                    {
                        "groupName": "cpu",
                        "replicas": 1,
                        "minReplicas": 1,
                        "maxReplicas": 1,
                        "rayStartParams": {},
                        "template": pod("ray-worker", worker),
                    }
                ],
            },
        },
    }


async def _create(custom: Any, namespace: str, body: dict[str, Any], **kwargs: Any) -> Any:
    if body["kind"] == "ServeGraph":
        return await custom.create_namespaced_custom_object(
            "servegraph.io", "v1alpha1", namespace, "servegraphs", copy.deepcopy(body), **kwargs
        )
    return await custom.create_namespaced_custom_object("ray.io", "v1", namespace, "rayservices", copy.deepcopy(body))


async def _refused(custom: Any, namespace: str, body: dict[str, Any], **kwargs: Any) -> str:
    with pytest.raises(ApiException) as err:
        await _create(custom, namespace, body, **kwargs)
    assert err.value.status in (400, 403, 422), err.value.body
    message: str = json.loads(err.value.body)["message"]
    return message


async def _until(custom: Any, namespace: str, body: dict[str, Any], refused_with: str | None, what: str) -> None:
    """Policy changes (its creation, each parameter change) take effect a moment later."""
    probe = copy.deepcopy(body)
    probe["metadata"]["name"] = "probe"

    async def effective() -> bool:
        try:
            await _create(custom, namespace, probe)
        except ApiException as exc:
            # Any other refusal is "not yet" too, and what the timeout reports.
            assert refused_with is not None and refused_with in str(exc.body), f"refused: {exc.status} {exc.body}"
            return True
        plural = "servegraphs" if probe["kind"] == "ServeGraph" else "rayservices"
        group, version = ("servegraph.io", "v1alpha1") if plural == "servegraphs" else ("ray.io", "v1")
        await custom.delete_namespaced_custom_object(group, version, namespace, plural, "probe")
        assert refused_with is None, f"accepted; expected a refusal naming {refused_with!r}"
        return True

    await eventually(effective, within=30, what=what)


@pytest.fixture
async def reserving(control_plane: ControlPlane, tenant: Any, namespace: str) -> AsyncIterator[Any]:
    """The policy with two allowed PriorityClasses, a reserved taint and a reserved node label."""
    _set_params(control_plane, RESERVING)
    try:
        on = _servegraph("x", {"workers": {"tolerations": [{"key": TAINT, "operator": "Exists"}]}})
        await _until(tenant, namespace, on, "may not tolerate the reserved taints", "the reservations to take effect")
        yield tenant
    finally:
        _set_params(control_plane, SHIPPED)
    off = _servegraph("x", {"workers": {"tolerations": [{"key": TAINT, "operator": "Exists"}]}})
    await _until(tenant, namespace, off, None, "the policy to be as shipped again")


async def test_as_shipped_a_tenant_may_name_no_priority_class_and_reserves_nothing(tenant: Any, namespace: str) -> None:
    preempting = _servegraph("preempting", {"workerGroups": {"gpu": {"priorityClassName": "system-cluster-critical"}}})
    await _until(tenant, namespace, preempting, "priorityClassName may be none", "the pod policy to take effect")
    message = await _refused(tenant, namespace, preempting)
    assert (
        "priorityClassName may be none (allowedPriorityClasses in the ServeGraphPodPolicy servegraph-pod-policy"
        in message
    )
    message = await _refused(tenant, namespace, _rayservice("own", head={"priorityClassName": "high"}))
    assert "priorityClassName may be none" in message
    # Nothing is reserved as shipped: any toleration, selector, affinity or node name passes.
    anything = {
        "tolerations": [{"operator": "Exists"}],
        "nodeSelector": {LABEL: "yes"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}
                    ]
                }
            }
        },
    }
    await _create(tenant, namespace, _servegraph("anywhere", {"head": anything, "workerGroups": {"cpu": anything}}))
    await _create(tenant, namespace, _rayservice("named-node", worker={"nodeName": "node-1", **anything}))


async def test_turned_off_and_on_again_the_policy_reads_its_current_parameters(
    control_plane: ControlPlane, tenant: Any, namespace: str
) -> None:
    """Deleting the binding is how docs/security.md turns the policy off. With a ConfigMap as
    its parameters that was enough to freeze them in the API server (kubernetes/kubernetes
    #130887): on again, a parameter change was never seen. A ServeGraphPodPolicy is read
    afresh."""
    preempting = _servegraph("preempt", {"workerGroups": {"gpu": {"priorityClassName": "serving"}}})
    await _until(tenant, namespace, preempting, "priorityClassName may be none", "the pod policy to take effect")
    control_plane.kubectl("delete", "validatingadmissionpolicybinding", "servegraph-pod-policy")
    await _until(tenant, namespace, preempting, None, "the policy to be off")
    control_plane.kubectl("apply", "-k", str(ROOT / "config" / "policy"))
    await _until(tenant, namespace, preempting, "priorityClassName may be none", "the policy to be on again")
    _set_params(control_plane, {"allowedPriorityClasses": "serving"})
    try:
        await _until(tenant, namespace, preempting, None, "the changed parameters to take effect")
    finally:
        _set_params(control_plane, SHIPPED)
    await _until(tenant, namespace, preempting, "priorityClassName may be none", "the policy to be as shipped again")


def _required(*expressions: dict[str, Any], fields: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    term: dict[str, Any] = {"matchExpressions": list(expressions)}
    if fields:
        term["matchFields"] = fields
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def _preferred(*expressions: dict[str, Any]) -> dict[str, Any]:
    preference = {"weight": 10, "preference": {"matchExpressions": list(expressions)}}
    return {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [preference]}}


RESERVED_TOLERATION = {"key": TAINT, "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
TAINT_MSG = f"tolerations may not tolerate the reserved taints {TAINT}, nor every taint"
LABEL_MSG = f"nodeSelector and node affinity may not ask for the reserved node labels {LABEL}"
# Each refused while the administrator reserves TAINT and LABEL and allows two PriorityClasses.
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "sg-group-priority": (
        _servegraph("p", {"workerGroups": {"gpu": {"priorityClassName": "system-node-critical"}}}),
        "priorityClassName may be serving, serving-gpu",
    ),
    "sg-head-priority": (_servegraph("p", {"head": {"priorityClassName": "high"}}), "priorityClassName may be"),
    "sg-workers-reserved-taint": (_servegraph("p", {"workers": {"tolerations": [RESERVED_TOLERATION]}}), TAINT_MSG),
    "sg-group-every-taint": (
        _servegraph("p", {"workerGroups": {"cpu": {"tolerations": [{"operator": "Exists"}]}}}),
        TAINT_MSG,
    ),
    "sg-head-reserved-taint": (
        _servegraph("p", {"head": {"tolerations": [{"key": TAINT, "operator": "Exists"}]}}),
        TAINT_MSG,
    ),
    "sg-group-reserved-selector": (
        _servegraph("p", {"workerGroups": {"cpu": {"nodeSelector": {LABEL: "yes"}}}}),
        LABEL_MSG,
    ),
    "sg-group-affinity-in": (
        _servegraph(
            "p", {"workerGroups": {"gpu": {"affinity": _required({"key": LABEL, "operator": "In", "values": ["x"]})}}}
        ),
        LABEL_MSG,
    ),
    "sg-workers-affinity-preferred-exists": (
        _servegraph("p", {"workers": {"affinity": _preferred({"key": LABEL, "operator": "Exists"})}}),
        LABEL_MSG,
    ),
    "rs-worker-reserved-taint": (_rayservice("r", worker={"tolerations": [RESERVED_TOLERATION]}), TAINT_MSG),
    "rs-head-reserved-selector": (_rayservice("r", head={"nodeSelector": {LABEL: "a"}}), LABEL_MSG),
    "rs-worker-affinity-gt": (
        _rayservice("r", worker={"affinity": _required({"key": LABEL, "operator": "Gt", "values": ["1"]})}),
        LABEL_MSG,
    ),
    "rs-worker-node-name": (_rayservice("r", worker={"nodeName": "gpu-node-1"}), "may not name their node"),
    "rs-worker-match-fields": (
        _rayservice(
            "r",
            worker={
                "affinity": _required(fields=[{"key": "metadata.name", "operator": "In", "values": ["gpu-node-1"]}])
            },
        ),
        "may not name their node (nodeName, node affinity matchFields)",
    ),
    "rs-head-priority": (
        _rayservice("r", head={"priorityClassName": "system-cluster-critical"}),
        "priorityClassName may be",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
async def test_reservations_and_the_priority_allowlist_are_held(reserving: Any, namespace: str, case: str) -> None:
    body, expected = REFUSED[case]
    message = await _refused(reserving, namespace, body)
    assert expected in message, message


async def test_placement_away_from_reserved_nodes_and_allowed_priorities_pass(reserving: Any, namespace: str) -> None:
    fine = {
        "nodeSelector": {"pool.example.com/general": "yes"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": _required(
            {"key": LABEL, "operator": "DoesNotExist"},
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]},
        )
        | {"podAntiAffinity": {}},
        "priorityClassName": "serving-gpu",
    }
    not_in = {
        "affinity": _preferred({"key": LABEL, "operator": "NotIn", "values": ["yes"]}),
        "priorityClassName": "serving",
    }
    await _create(
        reserving, namespace, _servegraph("fine", {"head": not_in, "workers": fine, "workerGroups": {"gpu": fine}})
    )
    await _create(reserving, namespace, _rayservice("fine", worker=fine, head=not_in))


async def test_the_crd_holds_worker_group_names_and_fields(tenant: Any, namespace: str) -> None:
    bad_name = _servegraph("n", {"workerGroups": {"GPU_pool": {"nodeSelector": {"a": "b"}}}})
    assert "worker group names are DNS-1035 labels of at most 20 characters" in await _refused(
        tenant, namespace, bad_name
    )
    bad_operator = _servegraph("o", {"workerGroups": {"gpu": {"tolerations": [{"key": "k", "operator": "Sometimes"}]}}})
    message = await _refused(tenant, namespace, bad_operator)
    assert 'spec.rayService.workerGroups.gpu.tolerations[0].operator: Unsupported value: "Sometimes"' in message
    # A group carries placement only: its resources are the workers' (the planner sizes every group from them).
    sized = _servegraph("s", {"workerGroups": {"gpu": {"resources": {"limits": {"cpu": "1"}}}}})
    message = await _refused(tenant, namespace, sized, field_validation="Strict")
    assert 'unknown field "spec.rayService.workerGroups.gpu.resources"' in message


# -- the graph's own hints reach the RayService's pod templates: held there -----------------------


@pytest.fixture
def operator(control_plane: ControlPlane, policy: None) -> Iterator[Component]:
    bind_operator_rbac(control_plane)
    component, _ = start_operator(control_plane, "servegraph-operator-placement")
    yield component
    control_plane.unspawn(component)


@pytest.fixture
async def kit(
    operator: Component, admin_api: Any, namespace: str, registry: RegistryServer, ca_pem: str
) -> AsyncIterator[Kit]:
    k = Kit(admin_api, namespace, registry, ca_pem)
    await k.secret("registry-token", {"token": REGISTRY_TOKEN})
    await k.secret("registry-ca", {"ca.crt": ca_pem})
    yield k
    await k.custom.delete_collection_namespaced_custom_object("servegraph.io", "v1alpha1", namespace, "servegraphs")


def _hinted(mutate: Callable[[graph_pb2.WorkerGroupHint], object]) -> bytes:
    graph = graph_pb2.Graph.FromString(sample_bytes("mini"))
    mutate(graph.cluster.worker_groups.add(name="cpu"))
    return graph.SerializeToString()


async def test_a_graphs_hint_asking_for_a_disallowed_priority_ends_in_apply_failed(kit: Kit, tenant: Any) -> None:
    """The placement can come from the graph (a worker-group hint): the operator's apply is
    refused, the ServeGraph says why, and nothing runs; the graph's allowed placement applies."""
    await _until(
        tenant,
        kit.namespace,
        _servegraph("x", {"head": {"priorityClassName": "p"}}),
        "priorityClassName may be",
        "the pod policy",
    )
    kit.registry.registry.publish(
        "preempting", _hinted(lambda h: setattr(h, "priority_class_name", "system-cluster-critical"))
    )
    await kit.servegraph("preempting", "preempting")
    cond = await kit.wait_condition("preempting", "Applied", "False", "ApplyFailed")
    assert "priorityClassName may be none" in cond["message"], cond
    assert await kit.get_rs("preempting") is None

    def tolerate(h: graph_pb2.WorkerGroupHint) -> None:
        h.tolerations.add(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
        h.node_selector["pool"] = "ray"

    kit.registry.registry.publish("placed", _hinted(tolerate))
    await kit.servegraph("placed", "placed")
    rs = await kit.wait_rs("placed")
    (group,) = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    pod = group["template"]["spec"]
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["nodeSelector"] == {"pool": "ray"}
