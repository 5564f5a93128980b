"""Two operator shards (`--shard a`, `--shard b`) on one real API server, each with its own
Lease: ServeGraphs relabelled from a to b while graphs are being published move without
the two ever writing the same object in turn.

Who wrote what is read from the API server's audit log: both shards run as the same user
(one ServiceAccount), and each names its shard in its user agent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client
from sg_support import OPERATOR_USER, SYSTEM_NS, Kit, bind_leader_election_rbac, sample_bytes, start_operator
from support import REGISTRY_TOKEN

from servegraph.kube import KubeClient, KubeError
from servegraph.names import SHARD_LABEL
from servegraph_testbed import WRITE_VERBS, Component, ControlPlane
from servegraph_testbed.registry import RegistryServer
from servegraph_testbed.waiting import eventually

STAYS = ["stay0", "stay1"]
MOVED = ["move0", "move1", "move2", "move3"]
GRAPHS = ("mini", "heterogeneous")
"""Published in turn under one name: every refresh then renders a different RayService."""


@pytest.fixture(scope="module")
def shards(control_plane: ControlPlane) -> Iterator[dict[str, Component]]:
    bind_leader_election_rbac(control_plane, "leader-election-shards")
    running: dict[str, Component] = {}
    try:
        for shard in ("a", "b"):
            name = f"shard-{shard}"
            running[shard], _ = start_operator(
                control_plane,
                name,
                f"--shard={shard}",
                "--leader-elect",
                f"--leader-election-namespace={SYSTEM_NS}",
                env={"POD_NAME": name},
            )
        yield running
    finally:
        for component in running.values():
            control_plane.unspawn(component)


@pytest.fixture
async def kit(
    shards: dict[str, Component], admin_api: Any, namespace: str, registry: RegistryServer, ca_pem: str
) -> AsyncIterator[Kit]:
    k = Kit(admin_api, namespace, registry, ca_pem)
    await k.secret("registry-token", {"token": REGISTRY_TOKEN})
    await k.secret("registry-ca", {"ca.crt": ca_pem})
    yield k


def _shard_of(event: dict[str, Any]) -> str | None:
    agent = event.get("userAgent", "")
    return next((s for s in ("a", "b") if agent.endswith(f"; shard {s})")), None)


def _writers(cp: ControlPlane, namespace: str, since: int) -> dict[tuple[str, str], list[str]]:
    """(resource, name) → the shards whose writes to it landed, in the order the API server completed them."""
    found: dict[tuple[str, str], list[str]] = {}
    for e in cp.audit_log.events(user=OPERATOR_USER, verbs=WRITE_VERBS, namespace=namespace, since=since):
        ref = e.get("objectRef") or {}
        if (
            ref.get("resource") not in ("servegraphs", "rayservices")
            or (e.get("responseStatus") or {}).get("code", 0) >= 300
        ):
            continue
        shard = _shard_of(e)
        assert shard is not None, f"an operator write without a shard in its user agent: {e.get('userAgent')}"
        found.setdefault((ref["resource"], ref["name"]), []).append(shard)
    return found


async def _label(kit: Kit, name: str, shard: str) -> None:
    await kit.patch_sg(name, {"metadata": {"labels": {SHARD_LABEL: shard}}})


async def _holder(coord: Any, lease: str) -> str | None:
    try:
        got = await coord.read_namespaced_lease(lease, SYSTEM_NS)
    except client.ApiException:
        return None
    return (got.spec.holder_identity or "").rsplit("_", 1)[0] or None


async def test_relabelled_servegraphs_move_shards_under_load_without_interleaved_writes(
    kit: Kit, control_plane: ControlPlane, admin_api: Any
) -> None:
    audit = control_plane.audit_log
    start = audit.offset()
    kit.registry.registry.publish("g", sample_bytes(GRAPHS[0]))
    for name in STAYS + MOVED:
        await kit.servegraph(name, "g")
        await _label(kit, name, "a")
    await kit.servegraph("stray", "g")  # no shard label: the default shard's, and neither of these
    for name in STAYS + MOVED:
        await kit.wait_condition(name, "Applied", "True")

    coord = client.CoordinationV1Api(admin_api)
    for shard in ("a", "b"):  # each shard elected its own leader, on its own Lease
        assert await _holder(coord, f"servegraph-operator-shard-{shard}") == f"shard-{shard}"

    mark = audit.offset()
    published = 0
    stop = asyncio.Event()

    async def publish_and_refresh() -> None:
        """New graph bytes and a refresh of every ServeGraph, over and over."""
        nonlocal published
        while not stop.is_set():
            published += 1
            kit.registry.registry.publish("g", sample_bytes(GRAPHS[published % 2]))
            for name in STAYS + MOVED:
                await kit.patch_sg(name, {"metadata": {"annotations": {"servegraph.io/refresh": str(published)}}})
            await asyncio.sleep(0.3)

    async def rounds(n: int) -> None:
        """Until n more rounds of publish and refresh have begun: the moves are spaced by work
        done, not by wall time, so a starved machine slows the test instead of thinning the load."""
        target = published + n

        async def begun() -> bool:
            return published >= target or load.done()

        await eventually(begun, within=120, interval=0.05, what=f"{n} more rounds of publish and refresh")
        if load.done():
            load.result()  # a refused patch ended the load: raise it here
            raise AssertionError("the load ended before it was stopped")

    load = asyncio.create_task(publish_and_refresh())
    try:
        await rounds(2)  # every ServeGraph refreshed under shard a, before anything moves
        for name in MOVED:
            await _label(kit, name, "b")
            await rounds(1)  # a publish between one move and the next
        await rounds(3)  # and load after the last move
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await load
    final = GRAPHS[published % 2]

    async def settled() -> bool:
        for name in STAYS + MOVED:
            status = (await kit.get_sg(name)).get("status") or {}
            if (status.get("graph") or {}).get("name") != final:
                return False
            if not any(c["type"] == "Applied" and c["status"] == "True" for c in status.get("conditions") or ()):
                return False
        return True

    await eventually(settled, within=60, what=f"every ServeGraph to run the last graph published ({final})")

    writers = _writers(control_plane, kit.namespace, mark)
    for name in STAYS:
        for resource in ("servegraphs", "rayservices"):
            assert set(writers.get((resource, name), ["a"])) == {"a"}, f"{resource}/{name}: {writers[resource, name]}"
        assert writers.get(("servegraphs", name)), f"shard a never wrote {name}'s status under load"
    for name in MOVED:
        for resource in ("servegraphs", "rayservices"):
            order = writers.get((resource, name), [])
            assert "b" in order, f"shard b never wrote {resource}/{name} after it moved: {order}"
            first_b = order.index("b")
            assert "a" not in order[first_b:], f"{resource}/{name}: shard a wrote after shard b: {order}"
    everything = _writers(control_plane, kit.namespace, start)
    assert not any(name == "stray" for _, name in everything), "a named shard wrote an unlabelled ServeGraph"
    stray = await kit.get_sg("stray")
    assert not stray.get("status"), "a named shard reconciled an unlabelled ServeGraph"


@pytest.mark.parametrize("labels", [{SHARD_LABEL: "elsewhere"}, {}], ids=["moved", "unlabelled"])
async def test_a_status_write_requires_the_shard_label_on_the_server(
    admin_api: Any, namespace: str, labels: dict[str, str]
) -> None:
    """The JSON-patch precondition itself, against the API server: shard c's status write to a
    ServeGraph that no longer carries `servegraph.io/shard=c` is refused and writes nothing.
    (Shard c and "elsewhere": no shard this module may be running owns them.)"""
    custom = client.CustomObjectsApi(admin_api)
    body = {
        "apiVersion": "servegraph.io/v1alpha1",
        "kind": "ServeGraph",
        "metadata": {"name": "g", "labels": {SHARD_LABEL: "c"}},
        "spec": {"source": {"url": "https://registry.test/g", "tokenSecretRef": {"name": "t"}}},
    }
    created = await custom.create_namespaced_custom_object("servegraph.io", "v1alpha1", namespace, "servegraphs", body)
    uid = created["metadata"]["uid"]
    kube = KubeClient(admin_api)
    kube.shard = "c"
    await kube.patch_servegraph_status(namespace, "g", uid, {"observedGeneration": 1})
    patch = [{"op": "replace", "path": "/metadata/labels", "value": labels}]
    await custom.patch_namespaced_custom_object(
        "servegraph.io", "v1alpha1", namespace, "servegraphs", "g", patch, _content_type="application/json-patch+json"
    )
    with pytest.raises(KubeError, match="moved to another shard") as refused:
        await kube.patch_servegraph_status(namespace, "g", uid, {"observedGeneration": 2})
    assert refused.value.reason == "Replaced"
    got = await custom.get_namespaced_custom_object("servegraph.io", "v1alpha1", namespace, "servegraphs", "g")
    assert got["status"] == {"observedGeneration": 1}
