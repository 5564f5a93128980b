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
Ownership is decided on the ConfigMap as read, and the write carries that read's
resourceVersion: if anyone changes it in between (an owner reference edited by hand),
the API server refuses the write (409) rather than the store overwriting it.
Reading is safe whoever wrote it: each graph is checked against its sha256 key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from servegraph.kube import KubeError
from servegraph.names import MANAGED_BY, MANAGED_BY_LABEL
from servegraph.operator.protocols import ConfigMapApi

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


def choose(order: Sequence[str], graphs: Mapping[str, bytes], budget: int = BUDGET) -> list[str]:
    """The digests to keep: in `order` (most wanted first) while they fit the budget."""
    kept: list[str] = []
    used = 0
    for digest in dict.fromkeys(order):
        data = graphs.get(digest)
        if data is None or used + len(data) > budget:
            continue
        kept.append(digest)
        used += len(data)
    return kept


def manifest(
    namespace: str,
    servegraph: str,
    owner: Mapping[str, Any],
    graphs: Mapping[str, bytes],
    resource_version: str | None = None,
) -> dict[str, Any]:
    """The ConfigMap to apply; with `resource_version`, applied only over that version of it."""
    metadata: dict[str, Any] = {
        "name": store_name(servegraph),
        "namespace": namespace,
        "labels": {MANAGED_BY_LABEL: MANAGED_BY},
        "ownerReferences": [dict(owner)],
    }
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "binaryData": {d: base64.b64encode(graphs[d]).decode() for d in sorted(graphs)},
    }


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


async def keep(
    api: ConfigMapApi,
    namespace: str,
    servegraph: str,
    owner: Mapping[str, Any],
    order: Sequence[str],
    new: Mapping[str, bytes],
    may_write: Callable[[], bool] = lambda: True,
) -> list[str]:
    """Store the graphs of `order` (new ones from `new`, the rest as already kept); returns what is kept.

    Raises KubeError (Conflict) for a ConfigMap of that name this ServeGraph does not control.
    """
    name = store_name(servegraph)
    cm = await api.get_configmap(namespace, name)
    if cm is not None and _controller_uid(cm) != owner.get("uid"):
        raise KubeError(
            "Conflict", f"ConfigMap {namespace}/{name} exists and this ServeGraph does not own it; not written", 409
        )
    current = _graphs(cm)
    graphs = {**current, **new}
    kept = choose(order, graphs)
    if sorted(kept) != sorted(current) and may_write():
        # Forced only over the version read and checked above (its resourceVersion is the
        # precondition); created without force: one made meanwhile by someone else answers 409.
        version = None if cm is None else str((cm.get("metadata") or {}).get("resourceVersion") or "") or None
        await api.apply_configmap(
            manifest(namespace, servegraph, owner, {d: graphs[d] for d in kept}, version), force=cm is not None
        )
    return kept
