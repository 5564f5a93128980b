"""Every limit a graph is held to, from its bytes to the RayService it renders (pure).

One set, read by the operator and by `servegraph validate`, so that what validates
is what the operator applies: a number the operator enforces is defined here once,
never copied into the command line's checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

MiB = 1024 * 1024

MAX_GRAPH_BYTES = 4 * MiB
"""The operator's default ceiling on one download (`servegraph run --max-graph-bytes`),
over any ServeGraph's `spec.source.maxBytes`: what its memory holds while a graph is
hashed and parsed. `servegraph validate` checks a graph's binary size against it."""

MAX_NODES = 10_000
"""Nodes in one graph, all applications together; fixed (not a flag): past it the
rendered RayService is over MAX_RAYSERVICE_BYTES anyway."""

MAX_INT32 = 2**31 - 1
"""KubeRay's replica counts are int32 (`replicas`, `minReplicas`, `maxReplicas`): the
API server refuses a RayService with more. A node's replicas and a worker group's
planned workers are held to it."""

MAX_MEMORY_BYTES = 2**62
"""One replica's `memory_bytes` (4Ei). A worker pod's memory is the largest replica's,
rounded up to whole GiB, and Kubernetes and Ray read it as an int64: this leaves room
for the rounding below 2^63."""

MIN_WORKER_MEMORY_BYTES = 256 * MiB
"""The least memory a Ray worker pod starts with: Ray sizes its object store at 30% of
the pod's memory and refuses to start below 75 MiB of it (ray_constants
OBJECT_STORE_MINIMUM_MEMORY_BYTES), so a smaller pod crash-loops whatever it hosts."""

MAX_RAYSERVICE_BYTES = 1_468_006  # 1.4 MiB of compact JSON
# Why 1.4 MiB: etcd refuses a write over its request limit, 1.5 MiB by default
# (--max-request-bytes), and what it stores is the manifest plus what the API server and
# KubeRay add (managedFields, status, resourceVersion...). The 100 KiB between is room for
# those; a manifest over it would be refused by the apply, or applied and then leave
# KubeRay's status writes failing.


def manifest_bytes(manifest: Mapping[str, Any]) -> int:
    """The manifest's size as the API server stores it (compact JSON)."""
    return len(orjson.dumps(manifest))


def rayservice_too_large(name: str, size: int, limit: int = MAX_RAYSERVICE_BYTES) -> str | None:
    """Why a rendered RayService of `size` bytes cannot be applied, or None when it fits."""
    if size <= limit:
        return None
    return (
        f"the rendered RayService {name} is {size:,} bytes of JSON, over the {limit:,} bytes the API server "
        "can store (etcd's 1.5 MiB request limit, less room for status): the operator refuses it (RenderTooLarge)"
    )


def graph_too_large(size: int, limit: int = MAX_GRAPH_BYTES) -> str | None:
    """Why a graph of `size` bytes (binary protobuf, as a registry serves it) would not be downloaded."""
    if size <= limit:
        return None
    return (
        f"the graph is {size:,} bytes as binary protobuf, over the {limit:,} bytes the operator downloads "
        "(its --max-graph-bytes; the download fails with TooLarge)"
    )
