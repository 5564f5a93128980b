"""The graphs a rollback may need, kept in the cluster: one ConfigMap per ServeGraph.

A rollback must work after an operator restart or a leader change, when nothing is in
memory and the registry may serve only the bad version; so the binary graph of every
version in `status.history` is kept in a ConfigMap in the ServeGraph's namespace, owned
by it (deleted with it by the garbage collector). A ConfigMap holds at most 1 MiB; the
store keeps the versions newest first within `BUDGET`, the last Ready version before
all others. A graph that does not fit is not kept, and its history entry says so
(`rollbackAvailable: false`).

The store writes only a ConfigMap its ServeGraph controls (owner reference with its
uid), or creates one where there is none: a ConfigMap of that name someone else made
is not taken over (`KubeError` Conflict; the rollout goes on without kept graphs).
Reading is safe whoever wrote it: each graph is checked against its sha256 key.

It writes without reading first. What it last wrote or read is remembered (`Stored`: the
ConfigMap's resourceVersion and the size of each graph in it), and a change is sent as a
merge patch of just that change (the new graph, null for each one dropped) with that
resourceVersion as its precondition: if anyone changed the ConfigMap since (an owner
reference edited, a key added, the ConfigMap deleted), the API server refuses it (409,
404) and the store reads it and decides again, ownership first. A ServeGraph whose status
says nothing is kept yet has its ConfigMap created without a read (409 AlreadyExists: read).
So a create or a publish costs one write, not a read of every kept graph and a write.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servegraph.kube import KubeError
from servegraph.names import MANAGED_BY, MANAGED_BY_LABEL
from servegraph.operator.protocols import ConfigMapApi
from servegraph.operator.values import Stored

BUDGET = 768 * 1024  # raw bytes; base64 in etcd stays well under its 1.5 MiB request limit
MAX_NAME = 253
SUFFIX = "-servegraph-graphs"


def store_name(servegraph: str) -> str:
    """`<name>-servegraph-graphs`, cut with a hash suffix when the name is long."""
    name = servegraph + SUFFIX
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(servegraph.encode()).hexdigest()[:8]
    return f"{servegraph[: MAX_NAME - len(SUFFIX) - 9]}-{digest}{SUFFIX}"


def choose(order: Sequence[str], sizes: Mapping[str, int], budget: int = BUDGET) -> list[str]:
    """The digests to keep: in `order` (most wanted first) while their sizes fit the budget."""
    kept: list[str] = []
    used = 0
    for digest in dict.fromkeys(order):
        size = sizes.get(digest)
        if size is None or used + size > budget:
            continue
        kept.append(digest)
        used += size
    return kept


def manifest(namespace: str, servegraph: str, owner: Mapping[str, Any], graphs: Mapping[str, bytes]) -> dict[str, Any]:
    """The ConfigMap to create."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": store_name(servegraph),
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "ownerReferences": [dict(owner)],
        },
        "binaryData": {d: _b64(graphs[d]) for d in sorted(graphs)},
    }


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _graphs(cm: Mapping[str, Any] | None) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for digest, encoded in ((cm or {}).get("binaryData") or {}).items():
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, TypeError):  # written by someone else: not a graph we kept
            continue
        if hashlib.sha256(data).hexdigest() == digest:
            out[digest] = data
    return out


async def load(api: ConfigMapApi, namespace: str, servegraph: str) -> dict[str, bytes]:
    """Every kept graph by sha256, checked against its key (a tampered entry is dropped)."""
    return _graphs(await api.get_configmap(namespace, store_name(servegraph)))


def _controller_uid(cm: Mapping[str, Any]) -> str | None:
    refs = (cm.get("metadata") or {}).get("ownerReferences") or ()
    return next((str(r.get("uid")) for r in refs if r.get("controller")), None)


@dataclass(frozen=True, slots=True)
class _Keep:
    """One keep: whose store, the graphs wanted (most first), the new ones' bytes, and whether
    the ServeGraph may still be written for."""

    namespace: str
    servegraph: str
    owner: Mapping[str, Any]
    order: Sequence[str]
    new: Mapping[str, bytes]
    may_write: Callable[[], bool]


async def keep(
    api: ConfigMapApi,
    namespace: str,
    servegraph: str,
    owner: Mapping[str, Any],
    order: Sequence[str],
    new: Mapping[str, bytes],
    may_write: Callable[[], bool] = lambda: True,
    known: Stored | None = None,
    exists: bool = True,
) -> tuple[list[str], Stored | None]:
    """Store the graphs of `order` (new ones from `new`, the rest as already kept): (what is
    kept, the store as now written). `known`: the store as last written (written over
    unread); `exists` False: nothing was kept for this ServeGraph yet (created unread).

    Raises KubeError (Conflict) for a ConfigMap of that name this ServeGraph does not control.
    """
    job = _Keep(namespace, servegraph, owner, order, new, may_write)
    name = store_name(servegraph)
    if known is not None and known.owner != owner.get("uid"):
        known = None
    if known is not None or not exists:
        try:
            return await _write(api, job, known)
        except KubeError as exc:
            if exc.status not in (404, 409):
                raise
            # Changed, deleted or made by someone else since: read it and decide again.
    cm = await api.get_configmap(namespace, name)
    if cm is None:
        return await _write(api, job, None)
    if _controller_uid(cm) != owner.get("uid"):
        raise KubeError(
            "Conflict", f"ConfigMap {namespace}/{name} exists and this ServeGraph does not own it; not written", 409
        )
    current = {d: len(data) for d, data in _graphs(cm).items()}
    stray = [key for key in cm.get("binaryData") or {} if key not in current]  # not a graph it holds: dropped
    return await _write(api, job, Stored.of(owner, cm, current), stray)


async def _write(
    api: ConfigMapApi, job: _Keep, known: Stored | None, stray: Sequence[str] = ()
) -> tuple[list[str], Stored | None]:
    """Create the ConfigMap (`known` None) or patch it over `known`; nothing when nothing changes."""
    current = dict(known.sizes) if known is not None else {}
    new = job.new
    kept = choose(job.order, {**current, **{d: len(data) for d, data in new.items()}}, BUDGET)
    added = [d for d in kept if d not in current]
    dropped = [*(d for d in current if d not in kept), *stray]
    if not (added or dropped) or not job.may_write():
        return [d for d in kept if d in current], known
    sizes = {d: current[d] if d in current else len(new[d]) for d in kept}
    if known is None:
        created = await api.create_configmap(
            manifest(job.namespace, job.servegraph, job.owner, {d: new[d] for d in kept})
        )
        return kept, Stored.of(job.owner, created, sizes)
    change: dict[str, str | None] = {d: _b64(new[d]) for d in added}
    change.update(dict.fromkeys(dropped))
    patch = {"metadata": {"resourceVersion": known.resource_version}, "binaryData": change}
    patched = await api.patch_configmap(job.namespace, store_name(job.servegraph), patch)
    return kept, Stored.of(job.owner, patched, sizes)
