"""Whether a rendered RayService fits in the API server, decided before any apply (pure).

A graph can be valid and still render a RayService the API server cannot store (the
Serve config names every node: a few hundred bytes each). Applying it fails the same
way on every retry, so it is refused once, with the size and the limit in the status,
until the graph or the spec changes (a new render).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from servegraph.names import ConditionType
from servegraph.operator.status.conditions import Condition

MAX_RAYSERVICE_BYTES = 1_468_006  # 1.4 MiB of compact JSON
# Why 1.4 MiB: etcd refuses a write over its request limit, 1.5 MiB by default
# (--max-request-bytes), and what it stores is the manifest plus what the API server and
# KubeRay add (managedFields, status, resourceVersion...). The 100 KiB between is room for
# those; a manifest over it would be refused by the apply, or applied and then leave
# KubeRay's status writes failing.


def manifest_bytes(manifest: Mapping[str, Any]) -> int:
    """The manifest's size as the API server stores it (compact JSON)."""
    return len(orjson.dumps(manifest))


def too_large(name: str, size: int, limit: int = MAX_RAYSERVICE_BYTES) -> Condition | None:
    """The Applied condition refusing a RayService of `size` bytes, or None when it fits."""
    if size <= limit:
        return None
    return Condition(
        ConditionType.APPLIED,
        False,
        "RenderTooLarge",
        f"the rendered RayService {name} is {size:,} bytes of JSON, over the {limit:,} bytes the API server "
        "can store (etcd's 1.5 MiB request limit, less room for status); not applied. The RayService stays "
        "as it is until a smaller graph is published or the spec changes",
    )
