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
from sg_support import Kit, bind_operator_rbac, pod_policy, sample_bytes, set_pod_policy, start_operator, tenant_api
from support import REGISTRY_TOKEN

from servegraph.v1 import graph_pb2
from servegraph_testbed import Component, ControlPlane
from servegraph_testbed.registry import RegistryServer
from servegraph_testbed.waiting import eventually

ALLOWED = "ghcr.io/servegraph/servegraph-ray:0.1.0"


@pytest.fixture(scope="module")
def policy(control_plane: ControlPlane) -> Iterator[None]:
    with pod_policy(control_plane):
        yield


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane, policy: None) -> Iterator[Component]:
    bind_operator_rbac(control_plane)
    component, _ = start_operator(control_plane, "servegraph-operator-policy")
    yield component
    control_plane.unspawn(component)


@pytest.fixture
async def tenant(control_plane: ControlPlane, namespace: str, api_client_for: Any) -> Any:
    """An ApiClient as a tenant who may edit ServeGraphs and Ray objects in its namespace only."""
    return await tenant_api(control_plane, namespace, api_client_for)


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


async def test_an_autoscaling_graphs_rendered_autoscaler_passes_the_policy(kit: Kit) -> None:
    """Issue 22: where a node autoscales the operator renders autoscalerOptions (the head's image,
    the ServeGraph's idle timeout and sidecar resources); the policy, which checks that
    image, lets it through, and KubeRay's CRD keeps every field."""
    graph = graph_pb2.Graph.FromString(sample_bytes("mini"))
    scaling = graph.applications[0].nodes["sentiment"].scaling
    scaling.ClearField("num_replicas")
    scaling.autoscaling.min_replicas, scaling.autoscaling.max_replicas = 1, 3
    kit.registry.registry.publish("autoscaled", graph.SerializeToString())
    autoscaler = {"idleTimeoutSeconds": 30, "upscalingMode": "Default", "resources": {"limits": {"memory": "1Gi"}}}
    body = _servegraph(kit, "autoscaled", {"autoscaler": autoscaler})
    body["spec"]["source"]["caBundle"] = {"secretRef": {"name": "registry-ca"}}
    await kit.custom.create_namespaced_custom_object("servegraph.io", "v1alpha1", kit.namespace, "servegraphs", body)
    await kit.wait_condition("autoscaled", "Applied", "True", within=60)
    rs = await kit.get_rs("autoscaled")
    assert rs is not None
    cluster = rs["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["autoscalerOptions"] == {
        "image": head["image"],
        "idleTimeoutSeconds": 30,
        "upscalingMode": "Default",
        "resources": {"requests": {"cpu": "100m"}, "limits": {"cpu": "500m", "memory": "1Gi"}},
    }
    assert head["image"].startswith("ghcr.io/servegraph/")


# -- issue 21, case 4: every field of a Ray object that becomes a pod or a Service ------------


def _full_rayservice(name: str) -> dict[str, Any]:
    """A legitimate RayService using every pod- and Service-producing field, each as a tenant
    may: a worker group, the autoscaler (its image and a non-root securityContext), a ClusterIP
    serve Service and head Service."""
    container = {
        "name": "ray-head",
        "image": ALLOWED,
        "ports": [{"containerPort": 8000, "name": "serve"}],
        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "allowPrivilegeEscalation": False},
    }
    worker = {"name": "ray-worker", "image": ALLOWED}
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": name},
        "spec": {
            "serveConfigV2": "applications: []\n",
            "serveService": {
                "metadata": {"name": f"{name}-serve"},
                "spec": {"type": "ClusterIP", "ports": [{"name": "serve", "port": 8000}]},
            },
            "rayClusterConfig": {
                "enableInTreeAutoscaling": True,
                "autoscalerOptions": {
                    "image": ALLOWED,
                    "securityContext": {"runAsNonRoot": True, "allowPrivilegeEscalation": False},
                },
                "headGroupSpec": {
                    "rayStartParams": {},
                    "serviceType": "ClusterIP",
                    "headService": {"spec": {"type": "ClusterIP"}},
                    "template": {"spec": {"securityContext": {"runAsNonRoot": True}, "containers": [container]}},
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "cpu",
                        "replicas": 1,
                        "minReplicas": 1,
                        "maxReplicas": 2,
                        "rayStartParams": {},
                        "template": {"spec": {"containers": [worker], "initContainers": [dict(worker, name="init")]}},
                    }
                ],
            },
        },
    }


def _cluster(rs: dict[str, Any]) -> dict[str, Any]:
    cluster: dict[str, Any] = rs["spec"]["rayClusterConfig"]
    return cluster


def _worker(rs: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = _cluster(rs)["workerGroupSpecs"][0]["template"]["spec"]
    return pod


def _head(rs: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = _cluster(rs)["headGroupSpec"]["template"]["spec"]
    return pod


# Each is allowed by the policy before issue 21: the mutation of the legitimate RayService,
# and the message that refuses it now.
HOLES: dict[str, tuple[Any, str]] = {
    "autoscaler-image": (
        lambda rs: _cluster(rs)["autoscalerOptions"].update(image="evil.example.com/miner:1"),
        "autoscalerOptions.image must start with one of: ghcr.io/servegraph/",
    ),
    "autoscaler-privileged": (
        lambda rs: _cluster(rs)["autoscalerOptions"]["securityContext"].update(privileged=True),
        "pod templates and autoscalerOptions may not run privileged containers",
    ),
    "autoscaler-capabilities": (
        lambda rs: _cluster(rs)["autoscalerOptions"]["securityContext"].update(capabilities={"add": ["NET_ADMIN"]}),
        "may not add capabilities other than NET_BIND_SERVICE",
    ),
    "autoscaler-as-root": (
        lambda rs: _cluster(rs)["autoscalerOptions"]["securityContext"].update(runAsUser=0, runAsNonRoot=False),
        "may not run as root",
    ),
    "host-port": (
        lambda rs: _head(rs)["containers"][0]["ports"].append({"containerPort": 22, "hostPort": 22}),
        "pod templates may not open ports on the node (ports[].hostPort)",
    ),
    "worker-privilege-escalation": (
        lambda rs: _worker(rs)["initContainers"][0].update(securityContext={"allowPrivilegeEscalation": True}),
        "may not allow privilege escalation (securityContext.allowPrivilegeEscalation)",
    ),
    "worker-run-as-user-0": (
        lambda rs: _worker(rs)["containers"][0].update(securityContext={"runAsUser": 0}),
        "may not run as root",
    ),
    "pod-run-as-non-root-false": (
        lambda rs: _head(rs)["securityContext"].update(runAsNonRoot=False),
        "may not run as root",
    ),
    "serve-service-external-ips": (
        lambda rs: rs["spec"]["serveService"]["spec"].update(externalIPs=["8.8.8.8"]),
        "may not set externalIPs: they take over traffic to any address (CVE-2020-8554)",
    ),
    "serve-service-node-port-type": (
        lambda rs: rs["spec"]["serveService"]["spec"].update(type="NodePort"),
        "(serveService, headService, headGroupSpec.serviceType) may have type ClusterIP only",
    ),
    "serve-service-load-balancer": (
        lambda rs: rs["spec"]["serveService"]["spec"].update(type="LoadBalancer"),
        "may have type ClusterIP only",
    ),
    "serve-service-node-port": (
        lambda rs: rs["spec"]["serveService"]["spec"]["ports"][0].update(nodePort=30080),
        "Service templates (serveService, headService) may not set a nodePort",
    ),
    "serve-service-load-balancer-ip": (
        lambda rs: rs["spec"]["serveService"]["spec"].update(loadBalancerSourceRanges=["0.0.0.0/0"]),
        "may not set loadBalancerIP, loadBalancerSourceRanges or loadBalancerClass",
    ),
    "head-service-external-ips": (
        lambda rs: _cluster(rs)["headGroupSpec"]["headService"]["spec"].update(externalIPs=["10.0.0.1"]),
        "may not set externalIPs",
    ),
    "head-ingress": (
        lambda rs: _cluster(rs)["headGroupSpec"].update(enableIngress=True),
        "headGroupSpec.enableIngress may not be set",
    ),
    "head-service-type": (
        lambda rs: _cluster(rs)["headGroupSpec"].update(serviceType="LoadBalancer"),
        "may have type ClusterIP only",
    ),
    # Issue 45: annotations that controllers act on, exposing the Service beyond the cluster.
    "serve-service-tailscale": (
        lambda rs: rs["spec"]["serveService"]["metadata"].update(annotations={"tailscale.com/expose": "true"}),
        "Service templates (serveService, headService) may carry annotations only under the prefixes none",
    ),
    "head-service-external-dns": (
        lambda rs: _cluster(rs)["headGroupSpec"]["headService"].update(
            metadata={"annotations": {"external-dns.alpha.kubernetes.io/hostname": "ray.example.com"}}
        ),
        "may carry annotations only under the prefixes none",
    ),
}


async def _until_active(custom: Any, namespace: str) -> None:
    """The policy takes effect a moment after it is created (and after each parameter change)."""

    async def active() -> bool:
        body = _full_rayservice("probe")
        _head(body)["containers"][0]["securityContext"]["privileged"] = True  # refused since the first policy
        try:
            await custom.create_namespaced_custom_object("ray.io", "v1", namespace, "rayservices", body)
        except ApiException as exc:
            return "may not run privileged containers" in str(exc.body)
        await custom.delete_namespaced_custom_object("ray.io", "v1", namespace, "rayservices", "probe")
        return False

    await eventually(active, within=30, what="the pod policy to take effect")


@pytest.mark.parametrize("hole", list(HOLES))
async def test_every_pod_and_service_field_of_a_rayservice_is_held_to_the_policy(
    kit: Kit, tenant: Any, hole: str
) -> None:
    custom = client.CustomObjectsApi(tenant)
    await _until_active(custom, kit.namespace)
    mutate, expected = HOLES[hole]
    body = _full_rayservice("hole")
    mutate(body)
    message = await _refused(
        lambda: custom.create_namespaced_custom_object("ray.io", "v1", kit.namespace, "rayservices", body)
    )
    assert expected in message
    # the legitimate one, with every field, is allowed
    await custom.create_namespaced_custom_object("ray.io", "v1", kit.namespace, "rayservices", _full_rayservice("ok"))


async def test_a_rayjobs_submitter_pod_is_held_to_the_policy(kit: Kit, tenant: Any) -> None:
    custom = client.CustomObjectsApi(tenant)
    await _until_active(custom, kit.namespace)
    submitter = {"name": "submit", "image": ALLOWED}
    job: dict[str, Any] = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": "job"},
        "spec": {
            "entrypoint": "python -c pass",
            "rayClusterSpec": _cluster(_full_rayservice("job")),
            "submitterPodTemplate": {"spec": {"restartPolicy": "Never", "containers": [submitter]}},
        },
    }
    bad = copy.deepcopy(job)
    bad["spec"]["submitterPodTemplate"]["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    message = await _refused(
        lambda: custom.create_namespaced_custom_object("ray.io", "v1", kit.namespace, "rayjobs", bad)
    )
    assert "may not run privileged containers" in message
    await custom.create_namespaced_custom_object("ray.io", "v1", kit.namespace, "rayjobs", job)


async def test_a_servegraphs_serve_service_is_held_to_the_policy(kit: Kit, tenant: Any) -> None:
    """The operator refuses it too (spec.rayService.serveService, InvalidSpec); with the policy
    installed the tenant hears it when writing the ServeGraph."""
    custom = client.CustomObjectsApi(tenant)
    await _until_active(custom, kit.namespace)

    async def create(name: str, serve: dict[str, Any]) -> Any:
        body = _servegraph(kit, name, {"image": ALLOWED, "serveService": serve})
        return await custom.create_namespaced_custom_object(
            "servegraph.io", "v1alpha1", kit.namespace, "servegraphs", body
        )

    message = await _refused(lambda: create("intercept", {"spec": {"externalIPs": ["8.8.8.8"]}}))
    assert "may not set externalIPs" in message
    message = await _refused(lambda: create("exposed", {"spec": {"type": "LoadBalancer"}}))
    assert "may have type ClusterIP only" in message
    await create("fine", {"metadata": {"labels": {"team": "a"}}, "spec": {"type": "ClusterIP"}})


async def test_the_administrator_can_allow_annotation_prefixes(
    kit: Kit, tenant: Any, control_plane: ControlPlane
) -> None:
    """Issue 45: annotations only under the prefixes the ServeGraphPodPolicy lists (none as shipped)."""
    custom = client.CustomObjectsApi(tenant)
    await _until_active(custom, kit.namespace)

    async def servegraph(name: str, annotations: dict[str, str]) -> Any:
        serve = {"metadata": {"annotations": annotations}, "spec": {"type": "ClusterIP"}}
        body = _servegraph(kit, name, {"image": ALLOWED, "serveService": serve})
        return await custom.create_namespaced_custom_object(
            "servegraph.io", "v1alpha1", kit.namespace, "servegraphs", body
        )

    scrape = {"prometheus.io/scrape": "true"}
    message = await _refused(lambda: servegraph("scraped", scrape))
    assert "may carry annotations only under the prefixes none: controllers act on them" in message
    set_pod_policy(control_plane, allowedServiceAnnotationPrefixes="prometheus.io/, example.com/team-")
    try:

        async def allowed() -> bool:
            try:
                await servegraph("scraped", scrape)
            except ApiException as exc:
                assert "may carry annotations only under the prefixes" in str(exc.body), exc.body
                return False
            return True

        await eventually(allowed, within=30, what="the widened policy to take effect")
        message = await _refused(lambda: servegraph("cilium", {**scrape, "service.cilium.io/global": "true"}))
        assert "only under the prefixes prometheus.io/, example.com/team-: controllers act on them" in message
    finally:
        set_pod_policy(control_plane, allowedServiceAnnotationPrefixes="")

    async def shipped() -> bool:  # as shipped again, for whatever runs next
        try:
            await servegraph("scraped-again", scrape)
        except ApiException:
            return True
        await custom.delete_namespaced_custom_object(
            "servegraph.io", "v1alpha1", kit.namespace, "servegraphs", "scraped-again"
        )
        return False

    await eventually(shipped, within=30, what="the policy to be as shipped again")


async def test_the_administrator_can_allow_node_ports(kit: Kit, tenant: Any, control_plane: ControlPlane) -> None:
    custom = client.CustomObjectsApi(tenant)
    await _until_active(custom, kit.namespace)
    body = _full_rayservice("nodeport")
    HOLES["serve-service-node-port-type"][0](body)
    HOLES["serve-service-node-port"][0](body)
    set_pod_policy(control_plane, allowedServiceTypes="NodePort")
    try:

        async def allowed() -> bool:
            try:
                await custom.create_namespaced_custom_object("ray.io", "v1", kit.namespace, "rayservices", body)
            except ApiException as exc:
                assert "may have type ClusterIP only" in str(exc.body) or "nodePort" in str(exc.body), exc.body
                return False
            return True

        await eventually(allowed, within=30, what="the widened policy to take effect")
        lb = _full_rayservice("lb")
        HOLES["serve-service-load-balancer"][0](lb)
        message = await _refused(
            lambda: custom.create_namespaced_custom_object("ray.io", "v1", kit.namespace, "rayservices", lb)
        )
        assert "may have type ClusterIP, NodePort only" in message
    finally:
        set_pod_policy(control_plane, allowedServiceTypes="")

    async def shipped() -> bool:  # as shipped again, for whatever runs next
        again = copy.deepcopy(body)
        again["metadata"]["name"] = "nodeport-again"
        try:
            await custom.create_namespaced_custom_object("ray.io", "v1", kit.namespace, "rayservices", again)
        except ApiException:
            return True
        await custom.delete_namespaced_custom_object("ray.io", "v1", kit.namespace, "rayservices", "nodeport-again")
        return False

    await eventually(shipped, within=30, what="the policy to be as shipped again")


# -- issue 45, item 10: shards follow namespaces, which only the administrator labels ----------


async def test_a_tenant_cannot_pick_its_servegraphs_shard(
    kit: Kit, tenant: Any, control_plane: ControlPlane, admin_api: Any
) -> None:
    """`servegraph.io/shard` selects the operator that reconciles a ServeGraph; set by the tenant,
    it moved a ServeGraph into a shard an administrator set aside for others."""
    custom = client.CustomObjectsApi(tenant)
    await _until_active(custom, kit.namespace)

    async def create(name: str, shard: str | None) -> Any:
        body = _servegraph(kit, name, {"image": ALLOWED})
        if shard is not None:
            body["metadata"]["labels"] = {"servegraph.io/shard": shard}
        return await custom.create_namespaced_custom_object(
            "servegraph.io", "v1alpha1", kit.namespace, "servegraphs", body
        )

    message = await _refused(lambda: create("sneaky", "reserved"))
    assert "the servegraph.io/shard label of a ServeGraph must be its namespace's (none)" in message
    await create("plain", None)
    # The tenant cannot label its namespace: shards are the administrator's to give.
    with pytest.raises(ApiException) as denied:
        await client.CoreV1Api(tenant).patch_namespace(
            kit.namespace, {"metadata": {"labels": {"servegraph.io/shard": "reserved"}}}
        )
    assert denied.value.status == 403
    await client.CoreV1Api(admin_api).patch_namespace(
        kit.namespace, {"metadata": {"labels": {"servegraph.io/shard": "team-a"}}}
    )

    async def follows() -> bool:  # the namespace's label, as the policy reads it a moment later
        try:
            await create("labelled", "team-a")
        except ApiException as exc:
            assert "must be its namespace's" in str(exc.body), exc.body
            return False
        return True

    await eventually(follows, within=30, what="the namespace's shard label to reach the policy")
    for shard in (None, "reserved"):
        message = await _refused(lambda shard=shard: create("elsewhere", shard))  # type: ignore[misc]
        assert "must be its namespace's (team-a): the administrator assigns shards by labelling namespaces" in message
    # Moving a ServeGraph out of the namespace's shard is refused; an update leaving the label
    # as it was (what the operator and a refresh write) still passes, also for "plain", made
    # before the namespace was labelled: the administrator relabels it.
    move = {"metadata": {"labels": {"servegraph.io/shard": "reserved"}}}
    message = await _refused(
        lambda: custom.patch_namespaced_custom_object(
            "servegraph.io", "v1alpha1", kit.namespace, "servegraphs", "labelled", move,
            _content_type="application/merge-patch+json",
        )
    )  # fmt: skip
    assert "must be its namespace's (team-a)" in message
    touch = {"metadata": {"annotations": {"servegraph.io/refresh": "now"}}}
    for name in ("labelled", "plain"):
        await custom.patch_namespaced_custom_object(
            "servegraph.io", "v1alpha1", kit.namespace, "servegraphs", name, touch,
            _content_type="application/merge-patch+json",
        )  # fmt: skip


async def test_gateways_and_gateway_classes_only_as_the_administrator_allows(
    kit: Kit, tenant: Any, control_plane: ControlPlane
) -> None:
    """Issue 48: a ServeGraph's spec.expose Gateway and any gatewayClassName KubeRay would create a
    Gateway of (a ServeGraph's or a tenant's own RayService) are refused unless allowed (none as shipped)."""
    custom = client.CustomObjectsApi(tenant)
    await _until_active(custom, kit.namespace)
    incremental = {
        "upgradeStrategy": "NewClusterWithIncrementalUpgrade",
        "clusterUpgradeOptions": {"gatewayClassName": "istio", "stepSizePercent": 10, "intervalSeconds": 30},
    }

    async def servegraph(name: str, ray_service: dict[str, Any], **spec: Any) -> Any:
        body = _servegraph(kit, name, {"image": ALLOWED, **ray_service})
        body["spec"].update(spec)
        return await custom.create_namespaced_custom_object(
            "servegraph.io", "v1alpha1", kit.namespace, "servegraphs", body
        )

    async def rayservice(name: str) -> Any:
        body = _rayservice(name)
        body["spec"]["upgradeStrategy"] = {"type": incremental["upgradeStrategy"], **incremental}
        del body["spec"]["upgradeStrategy"]["upgradeStrategy"]
        return await custom.create_namespaced_custom_object("ray.io", "v1", kit.namespace, "rayservices", body)

    public = {"gateway": {"namespace": "gateways", "name": "public"}}
    message = await _refused(lambda: servegraph("classy", incremental))
    assert message.endswith(
        "clusterUpgradeOptions.gatewayClassName may be none: KubeRay creates a Gateway of that class "
        "(allowedGatewayClasses of the ServeGraphPodPolicy servegraph-pod-policy)"
    ), message
    assert "allowedGatewayClasses" in await _refused(lambda: rayservice("own"))
    message = await _refused(lambda: servegraph("exposed", {}, expose=public))
    assert "spec.expose.gateway may be none (allowedGateways" in message
    set_pod_policy(control_plane, allowedGatewayClasses="traefik, istio", allowedGateways="gateways/*")
    try:

        async def allowed() -> bool:
            try:
                await servegraph("exposed", {}, expose=public)
            except ApiException as exc:
                assert "allowedGateways" in str(exc.body), exc.body
                return False
            return True

        await eventually(allowed, within=30, what="the widened policy to take effect")
        await servegraph("classy", incremental)
        await rayservice("own")
        elsewhere = {"gateway": {"namespace": "internet", "name": "edge"}}
        assert "may be gateways/*" in await _refused(lambda: servegraph("far", {}, expose=elsewhere))
        own_namespace = {"gateway": {"name": "edge"}}  # its namespace is the ServeGraph's
        assert "may be gateways/*" in await _refused(lambda: servegraph("near", {}, expose=own_namespace))
    finally:
        set_pod_policy(control_plane, allowedGatewayClasses="", allowedGateways="")
