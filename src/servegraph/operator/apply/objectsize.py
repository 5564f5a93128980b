"""Whether a rendered RayService fits in the API server, decided before any apply (pure).

A graph can be valid and still render a RayService the API server cannot store (the
Serve config names every node: a few hundred bytes each). Applying it fails the same
way on every retry, so it is refused once, with the size and the limit in the status,
until the graph or the spec changes (a new render).
"""

from __future__ import annotations

from servegraph.graph.limits import MAX_RAYSERVICE_BYTES as MAX_RAYSERVICE_BYTES
from servegraph.graph.limits import manifest_bytes as manifest_bytes
from servegraph.names import ConditionType
from servegraph.operator.conditions import Condition


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
