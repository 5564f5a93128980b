"""servegraph against the previous KubeRay it supports (KUBERAY_PREVIOUS_VERSION, 1.6.2),
on a control plane of its own: that release's CRDs and operator, with its shipped feature
gates, beside the session's current KubeRay.

What runs there and what does not:
- every sample renders only fields that release declares, with the API server's strict
  field validation (an unknown field is an error there, not a silent prune) and the CRD's
  own CEL rules;
- the operator's RayService is accepted and built into a RayCluster with each upgrade
  strategy;
- a cluster change goes through a new cluster with `NewCluster`, but with
  `NewClusterWithIncrementalUpgrade` not at all: the release's RayServiceIncrementalUpgrade
  gate is off (alpha), and KubeRay then treats the type like `None`
  (rayservice_controller.go:652 at v1.6.2);
- `spec.suspend` deletes the RayService: this release's RayService has no suspend, which the
  operator reads in its CRD at start.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from sg_support import (
    GROUP,
    PLURAL,
    VERSION,
    Kit,
    bind_operator_rbac,
    delete_namespace,
    read_log,
    sample_bytes,
    start_operator,
)
from support import REGISTRY_TOKEN, SAMPLES
from test_upgrade_strategies import INCREMENTAL

from servegraph.graph import load_graph
from servegraph.names import RESTARTED_AT_ANNOTATION
from servegraph.render import RayServiceOptions, render_rayservice
from servegraph.render.rayservice import UpgradeStrategy
from servegraph_testbed import Binaries, ControlPlane, KubeRayOperator
from servegraph_testbed.clients import api_client
from servegraph_testbed.registry import RegistryServer
from servegraph_testbed.rest import ApiError
from servegraph_testbed.waiting import eventually

OUR_CRDS = Path(__file__).resolve().parents[2] / "config" / "crd"
KUBERAY = "kuberay-operator-previous"
NOT_APPLIED = "Zero-downtime upgrade is disabled because UpgradeStrategy.Type is not set to NewCluster."
"""KubeRay 1.6.2's log line for a cluster change it will not make (rayservice_controller.go:653)."""
RESTART = "2026-11-28T09:00:00Z"
STRICT_DRY_RUN = "/apis/ray.io/v1/namespaces/default/rayservices?dryRun=All&fieldValidation=Strict"
"""A create the API server checks and does not store; Strict: an undeclared field is a 400
naming it, where it would otherwise be pruned without a word."""


@pytest.fixture(scope="module")
def previous(testenv_binaries: Binaries) -> Iterator[ControlPlane]:
    """A control plane with the previous KubeRay's CRDs and operator, and servegraph's operator."""
    kuberay = testenv_binaries.kuberay_previous
    with (
        ControlPlane(testenv_binaries, crds=[kuberay.kuberay_crds, OUR_CRDS]) as cp,
        KubeRayOperator(cp, kuberay=kuberay, name=KUBERAY),
    ):
        bind_operator_rbac(cp)
        # No Gateway API here: the operator starts without its kinds (nothing to watch), and the
        # class the incremental tests name is one the administrator allows.
        operator, _ = start_operator(cp, "servegraph-operator-previous", "--allow-gateway-classes", "istio")
        yield cp
        cp.unspawn(operator)
        log = read_log(operator.log_path)
        assert REGISTRY_TOKEN not in log
        assert "KubeRay's RayService: spec.suspend no" in log, "read from its CRD at start"


@pytest.fixture
async def kit(previous: ControlPlane, registry: RegistryServer, ca_pem: str) -> AsyncIterator[Kit]:
    async with api_client(previous) as api:
        namespace = f"prev-{uuid.uuid4().hex[:8]}"  # a deleted one stays Terminating here
        await client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        k = Kit(api, namespace, registry, ca_pem)
        await k.secret("registry-token", {"token": REGISTRY_TOKEN})
        await k.secret("registry-ca", {"ca.crt": ca_pem})
        yield k
        await delete_namespace(api, namespace)


def test_the_previous_kuberay_is_the_one_running(previous: ControlPlane, testenv_binaries: Binaries) -> None:
    crd = previous.rest().get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/rayservices.ray.io")
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    assert "suspend" not in v1["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"], "1.7's CRD"
    log = read_log(previous.component_log(KUBERAY))
    assert "RayServiceIncrementalUpgrade:false" in log.replace('"', "").replace(" ", ""), log[:2000]


@pytest.mark.parametrize("sample", sorted(p.stem for p in SAMPLES.glob("*.pb")))
@pytest.mark.parametrize("strategy", [None, INCREMENTAL], ids=["default", "incremental"])
def test_every_sample_renders_only_fields_the_previous_kuberay_declares(
    previous: ControlPlane, sample: str, strategy: dict[str, Any] | None
) -> None:
    upgrade = None
    if strategy is not None:
        o = strategy["clusterUpgradeOptions"]
        upgrade = UpgradeStrategy(
            strategy["upgradeStrategy"],
            gateway_class_name=o["gatewayClassName"],
            max_surge_percent=o["maxSurgePercent"],
            step_size_percent=o["stepSizePercent"],
            interval_seconds=o["intervalSeconds"],
        )
    options = RayServiceOptions(name=f"{sample}-x", upgrade_strategy=upgrade)
    manifest = render_rayservice(load_graph(SAMPLES / f"{sample}.pb"), options)
    stored = previous.rest().request("POST", STRICT_DRY_RUN, manifest)
    assert stored["kind"] == "RayService"
    assert stored["spec"].get("upgradeStrategy") == manifest["spec"].get("upgradeStrategy")


def test_a_field_only_the_current_kuberay_declares_is_refused_here(previous: ControlPlane) -> None:
    """The control: KubeRay 1.7's `spec.suspend`, which 1.6.2's CRD would silently prune."""
    manifest = render_rayservice(load_graph(SAMPLES / "mini.pb"), RayServiceOptions(name="mini-x"))
    manifest["spec"]["suspend"] = False
    with pytest.raises(ApiError) as err:
        previous.rest().request("POST", STRICT_DRY_RUN, manifest)
    assert err.value.status == 400 and 'unknown field "spec.suspend"' in str(err.value.body), err.value.body


@pytest.mark.parametrize(
    ("ray_service", "new_cluster"),
    [({"upgradeStrategy": "NewCluster"}, True), (INCREMENTAL, False)],
    ids=["NewCluster", "NewClusterWithIncrementalUpgrade"],
)
async def test_a_cluster_change_on_the_previous_kuberay(
    previous: ControlPlane, kit: Kit, ray_service: dict[str, Any], new_cluster: bool
) -> None:
    kit.registry.registry.publish(f"{kit.namespace}-g", sample_bytes("mini"))
    await kit.servegraph("g", f"{kit.namespace}-g")
    await kit.patch_sg("g", {"spec": {"rayService": ray_service}})

    def cluster(rs: dict[str, Any], side: str) -> str:
        return str(((rs.get("status") or {}).get(side) or {}).get("rayClusterName", ""))

    def built(rs: dict[str, Any]) -> bool:
        refused = [c for c in (rs.get("status") or {}).get("conditions") or [] if c.get("reason") == "ValidationFailed"]
        assert not refused, refused
        strategy = (rs["spec"].get("upgradeStrategy") or {}).get("type")
        return strategy == ray_service["upgradeStrategy"] and bool(cluster(rs, "pendingServiceStatus"))

    rs = await kit.wait_rs("g", built)
    first = cluster(rs, "pendingServiceStatus")
    # KubeRay names the cluster in its status first and creates it on a later reconcile, from
    # the spec it reads then: the change must come after, or the first cluster already has it.
    rayclusters = f"/apis/ray.io/v1/namespaces/{kit.namespace}/rayclusters"

    async def created() -> bool:
        return first in [c["metadata"]["name"] for c in previous.rest().get(rayclusters)["items"]]

    await eventually(created, within=60, what=f"RayCluster {first}")
    log_mark = len(read_log(previous.component_log(KUBERAY)))
    # What `servegraph restart` writes: the operator puts it into every pod template, so
    # KubeRay's hash of the cluster's spec changes.
    await kit.custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        kit.namespace,
        PLURAL,
        "g",
        {"metadata": {"annotations": {RESTARTED_AT_ANNOTATION: RESTART}}},
        _content_type="application/merge-patch+json",
    )
    await kit.wait_rs("g", lambda rs: RESTART in json.dumps(rs["spec"]["rayClusterConfig"]["headGroupSpec"]))

    if new_cluster:
        await kit.wait_rs("g", lambda rs: cluster(rs, "pendingServiceStatus") not in ("", first))
    else:

        async def refused() -> bool:
            return NOT_APPLIED in read_log(previous.component_log(KUBERAY))[log_mark:]

        await eventually(refused, within=60, what="KubeRay 1.6.2 declining the cluster change")
        rs = await kit.get_rs("g")
        assert rs is not None and cluster(rs, "pendingServiceStatus") == first, rs.get("status")
        clusters = previous.rest().get(rayclusters)["items"]
        assert [c["metadata"]["name"] for c in clusters] == [first], "no second cluster"


async def test_suspend_deletes_the_rayservice_on_the_previous_kuberay(previous: ControlPlane, kit: Kit) -> None:
    kit.registry.registry.publish(f"{kit.namespace}-g", sample_bytes("mini"))
    await kit.servegraph("g", f"{kit.namespace}-g")
    rs = await kit.wait_rs("g", lambda rs: bool(rs["metadata"].get("finalizers") or ()))
    await kit.patch_sg("g", {"spec": {"suspend": True}})
    await kit.wait_condition("g", "Ready", "False", "Suspended")

    async def gone() -> bool:
        return await kit.get_rs("g") is None

    await eventually(gone, within=90, what="the RayService deleted (KubeRay's finalizer removes its cluster first)")

    async def said() -> bool:
        applied = await kit.condition("g", "Applied")
        return (applied or {}).get("message") == "RayService g is deleted: no Ray cluster runs"

    await eventually(said, within=30, what="Applied saying the RayService is deleted")
    await kit.patch_sg("g", {"spec": {"suspend": False}})
    back = await kit.wait_rs("g")
    assert back["metadata"]["uid"] != rs["metadata"]["uid"] and "suspend" not in back["spec"], "created again"
