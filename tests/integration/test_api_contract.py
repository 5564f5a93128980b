"""One scenario suite, two API servers: the stand-in the unit tests drive the reconciler with
(tests/unit/memory_api.py) and the real kube-apiserver through `KubeClient`.

Every scenario runs against both and asserts the same literal results, so a behaviour the
operator relies on cannot differ between them: what server-side apply keeps, removes and
refuses per field manager, when the resourceVersion and generation move, KubeRay's status
and finalizer, delete preconditions, the status write's uid test, and absent objects.
Ownership is compared down to lists (see contract_support.owned): the stand-in keeps
lists other than ObjectMeta's atomic. An admission policy keeps KubeRay, when another
module of the session started it, off the contract's RayServices.
"""

from __future__ import annotations

import base64
import copy
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest
from contract_support import (
    CONTRACT_LABEL,
    KEEP_KUBERAY_OUT,
    Backend,
    Memory,
    Real,
    field_set,
    owned,
    owners,
    rayservice_defaults,
    view,
)
from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException
from support import SAMPLES

from servegraph.graph import load_graph
from servegraph.kube import KubeError
from servegraph.operator.spec import owner_reference
from servegraph.render.rayservice import RayServiceOptions, render_rayservice
from servegraph_testbed import ControlPlane
from servegraph_testbed.clients import api_client
from servegraph_testbed.waiting import eventually

NAME = "rs"
OURS, THEIRS = "servegraph-operator/Apply", "kubectl/Apply"
RCC = {
    "rayVersion": "2.9.0",
    "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [{"name": "head", "image": "ray"}]}}},
}
RCC_FIELDS = {
    ".spec.rayClusterConfig.rayVersion",
    ".spec.rayClusterConfig.headGroupSpec.rayStartParams",
    ".spec.rayClusterConfig.headGroupSpec.template.spec.containers",
}
LABEL_FIELD = f".metadata.labels.{CONTRACT_LABEL}"


@pytest.fixture(scope="module")
async def kuberay_kept_out(control_plane: ControlPlane) -> AsyncIterator[None]:
    """The admission policy that keeps KubeRay off the contract's RayServices, once it is in effect."""
    control_plane.kubectl("apply", "-f", "-", stdin=KEEP_KUBERAY_OUT)
    async with api_client(control_plane) as api:
        api.set_default_header("Impersonate-User", "kuberay-operator")
        api.set_default_header("Impersonate-Group", "system:masters")
        custom = client.CustomObjectsApi(api)

        async def refused() -> bool:
            body = ours("default")
            try:
                await custom.create_namespaced_custom_object(
                    "ray.io", "v1", "default", "rayservices", body, dry_run="All"
                )
            except ApiException as exc:
                return "written by the test alone" in str(exc.body)
            return False

        await eventually(refused, within=30, interval=0.2, what="the policy keeping KubeRay out in effect")
    yield
    control_plane.kubectl("delete", "-f", "-", "--wait=false", stdin=KEEP_KUBERAY_OUT, check=False)


@pytest.fixture(params=["memory", "real"])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == "memory":
        return Memory("contract")
    request.getfixturevalue("kuberay_kept_out")
    return Real(request.getfixturevalue("admin_api"), request.getfixturevalue("namespace"))


def partial(namespace: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A RayService manifest of only the fields given (what a second field manager applies)."""
    meta: dict[str, Any] = {"name": NAME, "namespace": namespace}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": meta, "spec": spec}


def ours(namespace: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A whole RayService manifest, as the operator applies one."""
    return partial(namespace, {CONTRACT_LABEL: "yes", **(labels or {})}, rayClusterConfig=RCC, **spec)


def configmap(namespace: str, **fields: dict[str, str]) -> dict[str, Any]:
    meta = {"name": "kept", "namespace": namespace}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, **fields}


async def refused(call: Awaitable[Any]) -> tuple[str, int | None]:
    with pytest.raises(KubeError) as raised:
        await call
    return raised.value.reason, raised.value.status


def rv(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["resourceVersion"])


async def test_the_operators_rendered_rayservice_is_stored_as_its_schema_defaults_it(backend: Backend) -> None:
    ns = backend.namespace
    owner = owner_reference(
        {
            "apiVersion": "servegraph.io/v1alpha1",
            "kind": "ServeGraph",
            "metadata": {"name": "mini", "uid": str(uuid.uuid4())},
        }
    )
    options = RayServiceOptions(name="mini", namespace=ns, labels={CONTRACT_LABEL: "yes"}, owner_references=(owner,))
    manifest = render_rayservice(load_graph(SAMPLES / "mini.pb"), options)
    applied = await backend.api.apply_rayservice(manifest, force=False)
    expected = copy.deepcopy(manifest)
    rayservice_defaults(expected)  # numOfHosts, priority, the ports' protocol
    assert view(applied) == view(expected) | {"generation": 1}
    assert await backend.api.get_rayservice(ns, "mini") == applied
    assert owners(applied) == {OURS: owned(field_set(expected))}


async def test_another_managers_apply_keeps_our_fields_and_owns_its_own(backend: Backend) -> None:
    ns = backend.namespace
    first = await backend.api.apply_rayservice(ours(ns, {"a": "1"}, serveConfigV2="x"), force=False)
    both = await backend.apply_as("kubectl", partial(ns, {"c": "3"}, excludeHeadPodFromServeSvc=False))
    assert rv(both) != rv(first)
    assert view(both)["labels"] == {CONTRACT_LABEL: "yes", "a": "1", "c": "3"}
    assert both["spec"] == {"rayClusterConfig": RCC, "serveConfigV2": "x", "excludeHeadPodFromServeSvc": False}
    assert both["metadata"]["generation"] == 2
    mine = {LABEL_FIELD, ".metadata.labels.a", ".spec.serveConfigV2", *RCC_FIELDS}
    assert owners(both) == {OURS: mine, THEIRS: {".metadata.labels.c", ".spec.excludeHeadPodFromServeSvc"}}
    again = await backend.api.apply_rayservice(ours(ns, {"a": "1"}, serveConfigV2="x"), force=False)
    assert again == both, "an apply that changes nothing writes nothing: the resourceVersion stays"


async def test_a_field_another_manager_owns_with_another_value_conflicts_unless_forced(backend: Backend) -> None:
    ns = backend.namespace
    base = await backend.api.apply_rayservice(ours(ns, serveConfigV2="x"), force=False)
    assert await refused(backend.apply_as("kubectl", partial(ns, serveConfigV2="y"))) == ("Conflict", 409)
    assert await backend.api.get_rayservice(ns, NAME) == base, "refused: nothing written"
    taken = await backend.apply_as("kubectl", partial(ns, serveConfigV2="y"), force=True)
    assert taken["spec"]["serveConfigV2"] == "y"
    assert owners(taken) == {OURS: {LABEL_FIELD, *RCC_FIELDS}, THEIRS: {".spec.serveConfigV2"}}
    assert await refused(backend.api.apply_rayservice(ours(ns, serveConfigV2="x"), force=False)) == ("Conflict", 409)
    back = await backend.api.apply_rayservice(ours(ns, serveConfigV2="x"), force=True)
    assert back["spec"]["serveConfigV2"] == "x" and back["metadata"]["generation"] == 3
    assert owners(back) == {OURS: {LABEL_FIELD, ".spec.serveConfigV2", *RCC_FIELDS}}, "kubectl owns nothing left"


async def test_a_value_two_managers_apply_alike_is_shared_and_outlives_our_omitting_it(backend: Backend) -> None:
    ns = backend.namespace
    first = await backend.api.apply_rayservice(ours(ns, {"b": "2"}, serveConfigV2="x"), force=False)
    shared = await backend.apply_as("kubectl", partial(ns, serveConfigV2="x"))
    assert rv(shared) != rv(first), "no value changed, but who owns them did"
    assert shared["metadata"]["generation"] == 1
    assert owners(shared) == {
        OURS: {LABEL_FIELD, ".metadata.labels.b", ".spec.serveConfigV2", *RCC_FIELDS},
        THEIRS: {".spec.serveConfigV2"},
    }
    dropped = await backend.api.apply_rayservice(ours(ns), force=False)
    assert dropped["spec"]["serveConfigV2"] == "x", "kubectl still owns it"
    assert view(dropped)["labels"] == {CONTRACT_LABEL: "yes"}, "ours alone: removed"
    assert owners(dropped) == {OURS: {LABEL_FIELD, *RCC_FIELDS}, THEIRS: {".spec.serveConfigV2"}}


async def test_a_nested_field_we_stop_applying_is_removed_whole(backend: Backend) -> None:
    ns = backend.namespace
    service = {"metadata": {"name": "serve"}, "spec": {"ports": [{"name": "serve", "port": 8000}]}}
    first = await backend.api.apply_rayservice(ours(ns, serveService=service), force=False)
    assert first["spec"]["serveService"]["spec"]["ports"] == [{"name": "serve", "port": 8000, "protocol": "TCP"}]
    removed = await backend.api.apply_rayservice(ours(ns), force=False)
    assert removed["spec"] == {"rayClusterConfig": RCC} and removed["metadata"]["generation"] == 2


async def test_an_apply_carrying_a_resource_version_writes_only_that_version(backend: Backend) -> None:
    ns = backend.namespace
    stale_on_absent = ours(ns, serveConfigV2="x")
    stale_on_absent["metadata"]["resourceVersion"] = "12345"
    created = await backend.api.apply_rayservice(stale_on_absent, force=False)  # absent: created all the same
    held = ours(ns, serveConfigV2="y")
    held["metadata"]["resourceVersion"] = rv(created)
    written = await backend.api.apply_rayservice(held, force=True)
    assert written["spec"]["serveConfigV2"] == "y" and rv(written) != rv(created)
    assert await refused(backend.api.apply_rayservice(held, force=True)) == ("Conflict", 409)
    assert await backend.api.get_rayservice(ns, NAME) == written


async def test_kuberays_status_moves_the_version_not_the_generation_and_survives_our_apply(backend: Backend) -> None:
    ns = backend.namespace
    first = await backend.api.apply_rayservice(ours(ns, serveConfigV2="x"), force=False)
    status = {"observedGeneration": 1, "serviceStatus": "Running"}
    reported = await backend.patch_as("kuberay-operator", "RayService", NAME, {"status": status}, status=True)
    assert rv(reported) != rv(first) and reported["metadata"]["generation"] == 1
    assert owners(reported)["kuberay-operator/Update/status"] == {
        ".status",
        ".status.observedGeneration",
        ".status.serviceStatus",
    }
    ignored = {**ours(ns, serveConfigV2="y"), "status": {"observedGeneration": 7}}
    applied = await backend.api.apply_rayservice(ignored, force=False)
    assert applied["status"] == status, "our writes never touch KubeRay's status"
    assert applied["metadata"]["generation"] == 2


async def test_a_hand_edit_owns_what_it_changed(backend: Backend) -> None:
    ns = backend.namespace
    await backend.api.apply_rayservice(ours(ns, serveConfigV2="x"), force=False)
    patch = {"metadata": {"annotations": {"note": "mine"}}, "spec": {"serveConfigV2": "hand"}}
    edited = await backend.patch_as("kubectl-edit", "RayService", NAME, patch)
    by_hand = {".metadata.annotations", ".metadata.annotations.note", ".spec.serveConfigV2"}
    assert owners(edited) == {OURS: {LABEL_FIELD, *RCC_FIELDS}, "kubectl-edit/Update": by_hand}
    assert await refused(backend.api.apply_rayservice(ours(ns, serveConfigV2="x"), force=False)) == ("Conflict", 409)
    repaired = await backend.api.apply_rayservice(ours(ns, serveConfigV2="x"), force=True)
    assert repaired["spec"]["serveConfigV2"] == "x" and repaired["metadata"]["annotations"] == {"note": "mine"}
    assert owners(repaired)["kubectl-edit/Update"] == {".metadata.annotations", ".metadata.annotations.note"}


async def test_a_delete_holds_to_its_uid_and_resource_version(backend: Backend) -> None:
    ns = backend.namespace
    old = await backend.api.apply_rayservice(ours(ns, serveConfigV2="x"), force=False)
    obj = await backend.api.apply_rayservice(ours(ns, serveConfigV2="y"), force=False)
    uid = obj["metadata"]["uid"]
    assert await refused(backend.api.delete_rayservice(ns, NAME, str(uuid.uuid4()), rv(obj))) == ("Conflict", 409)
    assert await refused(backend.api.delete_rayservice(ns, NAME, uid, rv(old))) == ("Conflict", 409)
    assert await backend.api.get_rayservice(ns, NAME) == obj
    await backend.api.delete_rayservice(ns, NAME, uid, rv(obj))
    assert await backend.api.get_rayservice(ns, NAME) is None
    await backend.api.delete_rayservice(ns, NAME, uid, rv(obj))  # gone already: no error


async def test_a_finalizer_holds_a_deleted_rayservice_until_it_is_removed(backend: Backend) -> None:
    ns = backend.namespace
    await backend.api.apply_rayservice(ours(ns, serveConfigV2="x"), force=False)
    finalizer = {"metadata": {"finalizers": ["ray.io/rayservice-finalizer"]}}
    held = await backend.patch_as("kuberay-operator", "RayService", NAME, finalizer)
    assert owners(held)["kuberay-operator/Update"] == {
        ".metadata.finalizers",
        '.metadata.finalizers["ray.io/rayservice-finalizer"]',
    }
    await backend.api.delete_rayservice(ns, NAME, held["metadata"]["uid"], rv(held))
    marked = await backend.api.get_rayservice(ns, NAME)
    assert marked is not None and view(marked)["deleting"] and marked["metadata"]["generation"] == 2
    assert rv(marked) != rv(held)
    await backend.api.delete_rayservice(ns, NAME, marked["metadata"]["uid"], rv(marked))
    assert await backend.api.get_rayservice(ns, NAME) == marked, "deleted again: nothing changes"
    await backend.patch_as("kuberay-operator", "RayService", NAME, {"metadata": {"finalizers": None}})
    assert await backend.api.get_rayservice(ns, NAME) is None


async def test_the_status_write_reaches_only_the_servegraph_of_that_uid(backend: Backend) -> None:
    ns = backend.namespace
    uid = await backend.create_servegraph("sg")
    await backend.api.patch_servegraph_status(ns, "sg", uid, {"observedGeneration": 1})
    written = await backend.get_servegraph("sg")
    assert written is not None and written["status"] == {"observedGeneration": 1}
    await backend.delete_servegraph("sg")
    await backend.create_servegraph("sg")
    assert await refused(backend.api.patch_servegraph_status(ns, "sg", uid, {"observedGeneration": 2})) == (
        "Replaced",
        409,
    )
    replaced = await backend.get_servegraph("sg")
    assert replaced is not None and "status" not in replaced
    await backend.delete_servegraph("sg")
    assert await refused(backend.api.patch_servegraph_status(ns, "sg", uid, {})) == ("NotFound", 404)


async def test_absent_objects_read_as_none_or_not_found(backend: Backend) -> None:
    ns = backend.namespace
    assert await backend.api.get_rayservice(ns, "absent") is None
    assert await backend.api.get_configmap(ns, "absent") is None
    assert await refused(backend.api.read_secret_data(ns, "absent")) == ("NotFound", 404)
    assert await refused(backend.api.read_configmap_key(ns, "absent", "k")) == ("NotFound", 404)


async def test_a_configmap_is_created_once_and_merge_patched_only_over_the_version_given(backend: Backend) -> None:
    ns = backend.namespace
    k1, k2, k3 = (base64.b64encode(x).decode() for x in (b"one", b"two", b"three"))
    first = await backend.api.create_configmap(configmap(ns, binaryData={"k1": k1}))
    assert "generation" not in first["metadata"]
    again = backend.api.create_configmap(configmap(ns, binaryData={"k2": k2}))
    assert await refused(again) == ("AlreadyExists", 409)
    change = {"metadata": {"resourceVersion": rv(first)}, "binaryData": {"k2": k2, "k1": None}}
    patched = await backend.api.patch_configmap(ns, "kept", change)
    assert patched["binaryData"] == {"k2": k2} and rv(patched) != rv(first)
    stale = {"metadata": {"resourceVersion": rv(first)}, "binaryData": {"k3": k3}}
    assert await refused(backend.api.patch_configmap(ns, "kept", stale)) == ("Conflict", 409)
    assert await refused(backend.api.patch_configmap(ns, "absent", stale)) == ("NotFound", 404)
    await backend.apply_as("kubectl", configmap(ns, data={"x": "y"}))
    assert await refused(
        backend.api.patch_configmap(ns, "kept", {**stale, "metadata": {"resourceVersion": rv(patched)}})
    ) == ("Conflict", 409)
    kept = await backend.api.get_configmap(ns, "kept") or {}
    assert (kept["binaryData"], kept["data"]) == ({"k2": k2}, {"x": "y"}), "the refused patches left nothing"
    assert await backend.api.read_configmap_key(ns, "kept", "x") == "y"
    assert await refused(backend.api.read_configmap_key(ns, "kept", "k2")) == ("KeyNotFound", None)


async def test_owner_references_merge_by_uid_and_two_controllers_are_invalid(backend: Backend) -> None:
    ns = backend.namespace
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "theirs", "uid": str(uuid.uuid4()), "controller": True}
    made = ours(ns, serveConfigV2="x")
    made["metadata"]["ownerReferences"] = [ref]
    await backend.apply_as("kubectl", made)
    mine = {**ref, "name": "mine", "uid": str(uuid.uuid4())}
    claim = ours(ns, serveConfigV2="x")
    claim["metadata"]["ownerReferences"] = [mine]
    assert await refused(backend.api.apply_rayservice(claim, force=False)) == ("Invalid", 422)
    claim["metadata"]["ownerReferences"] = [{**mine, "controller": False}]
    both = await backend.api.apply_rayservice(claim, force=False)
    assert both["metadata"]["ownerReferences"] == [ref, {**mine, "controller": False}]
    assert owners(both)[OURS] == {
        LABEL_FIELD,
        ".spec.serveConfigV2",
        *RCC_FIELDS,
        f'.metadata.ownerReferences[{{"uid":"{mine["uid"]}"}}]',
    }
