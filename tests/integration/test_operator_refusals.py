"""What the operator refuses to write, on the real kube-apiserver + etcd with RBAC: a
RayService too large to store, and a RayService or rollback ConfigMap taken over by hand,
whether before the operator looked or between its check and its write."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client
from sg_support import OPERATOR_USER, Kit, bind_operator_rbac, read_log, sample_bytes, start_operator
from support import REGISTRY_TOKEN, SAMPLES

from servegraph.graph import load_graph
from servegraph.kube import KubeClient, KubeError
from servegraph.names import GRAPH_LABEL
from servegraph.operator.apply.objectsize import MAX_RAYSERVICE_BYTES
from servegraph.operator.apply.ownership import NotOurs, apply_owned
from servegraph.operator.rollout import store
from servegraph.render import RayServiceOptions, render_rayservice, serve_config_yaml
from servegraph.v1 import graph_pb2
from servegraph_testbed import WRITE_VERBS, Component, ControlPlane
from servegraph_testbed.registry import RegistryServer
from servegraph_testbed.waiting import eventually


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane) -> Iterator[Component]:
    bind_operator_rbac(control_plane)
    component, _ = start_operator(control_plane, "servegraph-operator-refusals")
    yield component
    control_plane.unspawn(component)
    assert REGISTRY_TOKEN not in read_log(component.log_path), "the token reached the operator's log"


@pytest.fixture
async def kit(
    operator: Component, admin_api: Any, namespace: str, registry: RegistryServer, ca_pem: str
) -> AsyncIterator[Kit]:
    k = Kit(admin_api, namespace, registry, ca_pem)
    await k.secret("registry-token", {"token": REGISTRY_TOKEN + "\n"})
    await k.secret("registry-ca", {"ca.crt": ca_pem})
    yield k


def operator_writes(cp: ControlPlane, namespace: str, since: int, resource: str | None = None) -> list[Any]:
    return cp.audit_log.events(
        user=OPERATOR_USER, verbs=WRITE_VERBS, resource=resource, namespace=namespace, since=since
    )


async def refresh(kit: Kit, name: str, value: str) -> None:
    await kit.patch_sg(name, {"metadata": {"annotations": {"servegraph.io/refresh": value}}})


# -- too large to store ------------------------------------------------------------------------------


def oversized() -> bytes:
    """mini with 1.5 MB of user_config: a valid graph (within every graph limit) whose
    RayService is over what etcd stores."""
    g = graph_pb2.Graph.FromString(sample_bytes("mini"))
    node = next(iter(g.applications[0].nodes.values()))
    node.user_config.update({f"pad{i}": "x" * 60_000 for i in range(25)})
    return g.SerializeToString()


async def test_a_rayservice_too_large_to_store_is_refused_before_any_apply(
    kit: Kit, control_plane: ControlPlane
) -> None:
    mark = control_plane.audit_log.offset()
    kit.registry.registry.publish("big", oversized())
    await kit.servegraph("big", "big")
    cond = await kit.wait_condition("big", "Applied", "False", "RenderTooLarge")
    assert f"over the {MAX_RAYSERVICE_BYTES:,} bytes" in cond["message"] and "RayService big is 1,5" in cond["message"]
    await kit.wait_condition("big", "GraphValid", "True")
    assert await kit.get_rs("big") is None
    assert operator_writes(control_plane, kit.namespace, mark, "rayservices") == [], "no apply was even sent"
    events = [e for e in (await kit.core.list_namespaced_event(kit.namespace)).items if e.involved_object.name == "big"]
    assert any(e.reason == "ApplyFailed" and "RenderTooLarge" in e.message for e in events)

    # Not retried: once said, the operator writes nothing more for it.
    async def quiet() -> bool:
        since = control_plane.audit_log.offset()
        await asyncio.sleep(4)
        return not operator_writes(control_plane, kit.namespace, since)

    await eventually(quiet, within=60, what="the operator to stop writing for the refused graph")
    assert (await kit.condition("big", "Applied") or {})["lastTransitionTime"] == cond["lastTransitionTime"]

    kit.registry.registry.publish("big", sample_bytes("mini"))  # a new version is the next attempt
    await refresh(kit, "big", "smaller")
    await kit.wait_condition("big", "Applied", "True", "UpToDate")
    assert await kit.get_rs("big") is not None


# -- issue 45: serveService annotations, which controllers act on -------------------------------------


async def test_a_serve_service_annotation_no_prefix_allows_is_refused_and_nothing_is_written(
    kit: Kit, control_plane: ControlPlane
) -> None:
    """Without the policy installed, the operator is the one that holds the line: by default
    (no --allow-serve-service-annotations) no annotation reaches the serve Service, and a
    running graph keeps its RayService as it was."""
    kit.registry.registry.publish("exposed", sample_bytes("mini"))
    await kit.servegraph("exposed", "exposed")
    await kit.wait_condition("exposed", "Applied", "True")
    mark = control_plane.audit_log.offset()
    serve = {"metadata": {"annotations": {"tailscale.com/expose": "true"}}}
    await kit.patch_sg("exposed", {"spec": {"rayService": {"serveService": serve}}})
    cond = await kit.wait_condition("exposed", "Fetched", "False", "InvalidSpec")
    assert cond["message"].startswith(
        "spec.rayService.serveService.metadata.annotations['tailscale.com/expose']: not allowed "
        "(controllers act on annotations; the prefixes allowed: none"
    ), cond["message"]
    rs = await kit.get_rs("exposed")
    assert rs is not None and "serveService" not in rs["spec"]
    assert operator_writes(control_plane, kit.namespace, mark, "rayservices") == []


# -- a RayService taken over by hand -------------------------------------------------------------------


async def test_a_rayservice_taken_over_by_hand_is_refused_not_overwritten(
    kit: Kit, control_plane: ControlPlane
) -> None:
    """Label and owner reference removed by hand: the record the operator holds may still say
    "ours" (the watch's delivery of the edit can come after the next reconcile). The next
    apply must not take it back."""
    kit.registry.registry.publish("mini", sample_bytes("mini"))
    await kit.servegraph("g", "mini")
    await kit.wait_condition("g", "Applied", "True")
    rs = await kit.wait_rs("g")
    await kit.custom.patch_namespaced_custom_object(
        "ray.io",
        "v1",
        kit.namespace,
        "rayservices",
        "g",
        [
            {"op": "remove", "path": "/metadata/ownerReferences"},
            {"op": "remove", "path": f"/metadata/labels/{GRAPH_LABEL.replace('/', '~1')}"},
        ],
        _content_type="application/json-patch+json",
    )
    mark = control_plane.audit_log.offset()
    kit.registry.registry.publish("mini", sample_bytes("complete"))  # a new version: a write is due
    await refresh(kit, "g", "taken")
    cond = await kit.wait_condition("g", "Applied", "False", "Conflict")
    assert "no ServeGraph controls it" in cond["message"]
    await kit.wait_condition("g", "Ready", "False", "Conflict")
    now = await kit.get_rs("g") or {}
    assert now["spec"]["serveConfigV2"] == rs["spec"]["serveConfigV2"], "not overwritten"
    assert not now["metadata"].get("ownerReferences") and GRAPH_LABEL not in now["metadata"]["labels"]
    # The watch delivers the edit (it delivers every RayService), so no write is tried; if the
    # reconcile ran first, its one write carried the version the operator held and was refused.
    writes = operator_writes(control_plane, kit.namespace, mark, "rayservices")
    codes = [e["responseStatus"]["code"] for e in writes]
    assert codes in ([], [409]), [(e["verb"], e.get("requestURI"), e["responseStatus"]["code"]) for e in writes]


# -- the precondition itself: a hand edit between the operator's check and its write -----------------


class EditAfterRead:
    """The operator's API client, with a hand edit (by the admin) landing right after its read."""

    def __init__(self, api: KubeClient, edit: Callable[[], Awaitable[None]]) -> None:
        self.client = api
        self.edit = edit

    async def get_rayservice(self, namespace: str, name: str) -> dict[str, Any] | None:
        got = await self.client.get_rayservice(namespace, name)
        await self.edit()
        return got

    async def apply_rayservice(self, manifest: Any, force: bool = True) -> dict[str, Any]:
        return await self.client.apply_rayservice(manifest, force)

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        got = await self.client.get_configmap(namespace, name)
        await self.edit()
        return got

    async def create_configmap(self, manifest: Any) -> dict[str, Any]:
        return await self.client.create_configmap(manifest)

    async def patch_configmap(self, namespace: str, name: str, patch: Any) -> dict[str, Any]:
        return await self.client.patch_configmap(namespace, name, patch)


OWNER_UID = "0b5e4f3a-0000-4000-8000-00000000c0de"


def owner() -> dict[str, Any]:
    return {
        "apiVersion": "servegraph.io/v1alpha1",
        "kind": "ServeGraph",
        "name": "g",
        "uid": OWNER_UID,
        "controller": True,
        "blockOwnerDeletion": False,
    }


async def test_a_rayservice_whose_owner_changes_between_the_check_and_the_write_is_not_overwritten(
    control_plane: ControlPlane, admin_api: Any, api_client_for: Any, namespace: str
) -> None:
    bind_operator_rbac(control_plane)
    operator_client = KubeClient(await api_client_for(OPERATOR_USER))
    admin = KubeClient(admin_api)
    graph = load_graph(SAMPLES / "mini.pb")
    options = RayServiceOptions(name="raced", namespace=namespace, owner_references=(owner(),))
    await admin.apply_rayservice(render_rayservice(graph, options), force=False)

    async def take_over() -> None:
        await client.CustomObjectsApi(admin_api).patch_namespaced_custom_object(
            "ray.io",
            "v1",
            namespace,
            "rayservices",
            "raced",
            [{"op": "remove", "path": "/metadata/ownerReferences"}],
            _content_type="application/json-patch+json",
        )

    racy = EditAfterRead(operator_client, take_over)
    new = render_rayservice(load_graph(SAMPLES / "complete.pb"), options)
    with pytest.raises(KubeError) as info:
        await apply_owned(racy, new, OWNER_UID, exists=True)
    assert info.value.status == 409, str(info.value)
    now = await admin.get_rayservice(namespace, "raced") or {}
    assert not now["metadata"].get("ownerReferences"), "the hand edit stands"
    assert now["spec"]["serveConfigV2"] == serve_config_yaml(graph), "the write was refused whole"

    # Read again without a race: it is no longer ours, and nothing is written.
    with pytest.raises(NotOurs):
        await apply_owned(operator_client, new, OWNER_UID, exists=True)


async def test_a_store_configmap_whose_owner_changes_between_the_check_and_the_write_is_not_overwritten(
    control_plane: ControlPlane, admin_api: Any, api_client_for: Any, namespace: str
) -> None:
    bind_operator_rbac(control_plane)
    operator_client = KubeClient(await api_client_for(OPERATOR_USER))
    admin = KubeClient(admin_api)
    one, two = b"graph one", b"graph two"
    d1, d2 = hashlib.sha256(one).hexdigest(), hashlib.sha256(two).hexdigest()
    await store.keep(admin, namespace, "g", owner(), [d1], {d1: one})
    name = store.store_name("g")

    async def take_over() -> None:
        await client.CoreV1Api(admin_api).patch_namespaced_config_map(
            name,
            namespace,
            [
                {"op": "remove", "path": "/metadata/ownerReferences"},
                {"op": "add", "path": "/data", "value": {"x": "theirs"}},
            ],
            _content_type="application/json-patch+json",
        )

    with pytest.raises(KubeError) as info:
        await store.keep(EditAfterRead(operator_client, take_over), namespace, "g", owner(), [d2, d1], {d2: two})
    assert info.value.status == 409, str(info.value)
    cm = await admin.get_configmap(namespace, name) or {}
    assert not cm["metadata"].get("ownerReferences") and cm["data"] == {"x": "theirs"}
    assert sorted(cm["binaryData"]) == [d1], "the refused write left nothing"


async def test_a_store_configmap_changed_after_the_store_wrote_it_is_read_before_it_is_written_again(
    control_plane: ControlPlane, admin_api: Any, api_client_for: Any, namespace: str
) -> None:
    """The store writes unread over the version it wrote last: the real API server refuses that
    patch once anyone changed the ConfigMap, and the store reads it and decides again."""
    bind_operator_rbac(control_plane)
    operator_client = KubeClient(await api_client_for(OPERATOR_USER))
    admin = KubeClient(admin_api)
    one, two, three = b"graph one", b"graph two", b"graph three"
    d1, d2, d3 = (hashlib.sha256(x).hexdigest() for x in (one, two, three))
    kept, known = await store.keep(operator_client, namespace, "g", owner(), [d1], {d1: one}, exists=False)
    kept, known = await store.keep(operator_client, namespace, "g", owner(), [d2, d1], {d2: two}, known=known)
    name = store.store_name("g")
    assert sorted((await admin.get_configmap(namespace, name) or {})["binaryData"]) == sorted([d1, d2]) == sorted(kept)

    # A label added by hand: still ours, written after a read.
    await client.CoreV1Api(admin_api).patch_namespaced_config_map(
        name, namespace, {"metadata": {"labels": {"team": "a"}}}
    )
    kept, stale = await store.keep(operator_client, namespace, "g", owner(), [d3, d2, d1], {d3: three}, known=known)
    assert sorted(kept) == sorted([d1, d2, d3])
    cm = await admin.get_configmap(namespace, name) or {}
    assert sorted(cm["binaryData"]) == sorted(kept) and cm["metadata"]["labels"]["team"] == "a"

    # Taken over by hand after that write: the unread patch is refused, the read finds it not ours.
    await client.CoreV1Api(admin_api).patch_namespaced_config_map(
        name,
        namespace,
        [{"op": "remove", "path": "/metadata/ownerReferences"}],
        _content_type="application/json-patch+json",
    )
    with pytest.raises(KubeError) as info:
        await store.keep(operator_client, namespace, "g", owner(), [d1, d3], {d1: one}, known=stale)
    assert info.value.status == 409 and "does not own it" in str(info.value)
    assert sorted((await admin.get_configmap(namespace, name) or {})["binaryData"]) == sorted(kept)
