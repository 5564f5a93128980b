"""What the operator bench compares the operator with: the same writes, no operator between.

The floor is what a minimal client would send for each ServeGraph, made with the
operator's own client code (`KubeClient`, raw JSON, its session): every write the
operator makes, once, in its order, and no reads. A create is: the ServeGraph (the
user's write, in both runs), the kept-graphs ConfigMap created (operator/rollout/store.py),
the RayService, the status, one Event. A republish is: the refresh annotation (when the
events endpoint carries it), the new version merge-patched into the ConfigMap, the
RayService, the status, one Event. The bench counts both sides' writes in the audit log and names any
kind of write the operator made that the floor did not (`missing`): then the floor is
wrong, not the operator fast.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio import client

from servegraph.kube import KubeClient
from servegraph.names import API_VERSION, GROUP, KIND, PLURAL, REFRESH_ANNOTATION, VERSION
from servegraph.operator import conditions
from servegraph.operator.rollout import store
from servegraph.operator.spec import owner_reference
from servegraph_testbed import WRITE_VERBS


@dataclass
class FloorItem:
    """One ServeGraph of the floor: where, and what to write for it (owner filled in on create)."""

    namespace: str
    name: str
    spec: dict[str, Any]
    configmap: dict[str, Any]
    rayservice: dict[str, Any]
    status: dict[str, Any]
    body: dict[str, Any] | None = None  # the ServeGraph as created
    added: dict[str, str] | None = None  # a republish: the graph it adds to the ConfigMap (base64)


def owned(manifest: Mapping[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    return {**manifest, "metadata": {**manifest["metadata"], "ownerReferences": [dict(owner)]}}


async def bounded(items: Iterable[Any], one: Callable[[Any], Awaitable[None]], concurrency: int) -> float:
    """Run `one` over `items`, `concurrency` at a time; wall seconds."""
    sem = asyncio.Semaphore(concurrency)

    async def run(item: Any) -> None:
        async with sem:
            await one(item)

    start = time.monotonic()
    await asyncio.gather(*(run(i) for i in items))
    return time.monotonic() - start


async def raw_apply(kube: KubeClient, manifests: Sequence[Mapping[str, Any]], concurrency: int) -> float:
    """The API server's limit: the same RayServices, server-side applied in a tight loop."""

    async def one(m: Mapping[str, Any]) -> None:
        await kube.apply_rayservice(m, force=True)

    return await bounded(manifests, one, concurrency)


async def floor_create(kube: KubeClient, items: Sequence[FloorItem], concurrency: int) -> float:
    custom = client.CustomObjectsApi(kube.api)

    async def one(item: FloorItem) -> None:
        body = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": item.name}, "spec": item.spec}
        sg = await custom.create_namespaced_custom_object(GROUP, VERSION, item.namespace, PLURAL, body)
        item.body = sg
        owner = owner_reference(sg)
        await kube.create_configmap(owned(item.configmap, owner))
        await kube.apply_rayservice(owned(item.rayservice, owner), force=False)
        await kube.patch_servegraph_status(item.namespace, item.name, sg["metadata"]["uid"], item.status)
        await kube.post_event(sg, "Normal", "Applied", f"created RayService {item.name}", conditions.now_rfc3339())

    return await bounded(items, one, concurrency)


async def floor_update(kube: KubeClient, items: Sequence[FloorItem], annotate: bool, concurrency: int) -> float:
    """A republish of each (already created) item: its new ConfigMap, RayService and status."""

    async def one(item: FloorItem) -> None:
        assert item.body is not None, "floor_update before floor_create"
        owner = owner_reference(item.body)
        if annotate:
            await kube.annotate_servegraph(item.namespace, item.name, {REFRESH_ANNOTATION: f"floor-{item.name}"})
        meta = item.configmap["metadata"]
        await kube.patch_configmap(meta["namespace"], meta["name"], {"binaryData": item.added})
        await kube.apply_rayservice(owned(item.rayservice, owner), force=True)
        await kube.patch_servegraph_status(item.namespace, item.name, item.body["metadata"]["uid"], item.status)
        await kube.post_event(
            item.body, "Normal", "Applied", f"updated RayService {item.name}", conditions.now_rfc3339()
        )

    return await bounded(items, one, concurrency)


def configmap(namespace: str, name: str, graphs: Mapping[str, bytes]) -> dict[str, Any]:
    """The kept-graphs ConfigMap as the store writes it (the owner is set per ServeGraph)."""
    return store.manifest(namespace, name, {}, graphs)


def kind(event: Mapping[str, Any]) -> str:
    """`verb resource[/subresource]` of an audit event, e.g. `patch servegraphs/status`."""
    ref = event.get("objectRef") or {}
    sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
    return f"{event.get('verb')} {ref.get('resource')}{sub}"


def requests_by_kind(events: Iterable[Mapping[str, Any]], namespaces: Collection[str], writes: bool) -> Counter[str]:
    found: Counter[str] = Counter()
    for e in events:
        if (e.get("objectRef") or {}).get("namespace") not in namespaces:
            continue
        if writes != (e.get("verb") in WRITE_VERBS):
            continue
        found[kind(e)] += 1
    return found


def per_item(counts: Mapping[str, int], n: int) -> dict[str, float]:
    return {k: round(v / n, 3) for k, v in sorted(counts.items())} if n else {}


def missing(operator: Mapping[str, float], floor: Mapping[str, float]) -> list[str]:
    """Kinds of write the operator made and the floor did not (the user's creates aside)."""
    return sorted(k for k in operator if k not in floor)
