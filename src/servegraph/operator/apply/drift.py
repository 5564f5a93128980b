"""Whether a live RayService is still what the operator applied (pure).

Compared when the watch delivers the object, not on every reconcile: the result
is kept as a small `Live` record (operator/kuberay.py), so a thousand RayServices are
not held in memory and a reconcile triggered by KubeRay's status updates compares two keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servegraph.names import SPEC_HASH_ANNOTATION
from servegraph.operator.kuberay import Live, live_digest, live_record
from servegraph.operator.values import Desired


def live_of(body: Mapping[str, Any], desired: Desired | None) -> Live:
    """Condense a watched or read RayService, comparing it with the desired one if there is one yet."""
    if desired is None:
        return live_record(body, None, compared=False)
    digest = live_digest(body)
    return live_record(body, desired.match_key if up_to_date(body, desired, digest) else None, serve_digest=digest)


def up_to_date(live: Mapping[str, Any], desired: Desired, digest: str) -> bool:
    """Our hash annotation matches and every field we render is still as rendered
    (`digest`: the live Serve config's `live_digest`)."""
    lm, dm = live.get("metadata") or {}, desired.frame["metadata"]
    spec = live.get("spec") or {}
    return (
        (lm.get("annotations") or {}).get(SPEC_HASH_ANNOTATION) == dm["annotations"][SPEC_HASH_ANNOTATION]
        and contains(lm.get("labels") or {}, dm["labels"])
        and contains(lm.get("ownerReferences") or [], dm.get("ownerReferences") or [])
        and contains(spec, desired.frame["spec"])
        and digest == desired.serve_digest
    )


def contains(live: Any, desired: Any) -> bool:
    """Whether `live` has every field `desired` sets, with the same value.

    Fields the API server or KubeRay add (defaults, status) do not count as drift;
    a changed or removed field of ours does.
    """
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(k in live and contains(live[k], v) for k, v in desired.items())
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(live) == len(desired)
            and all(contains(a, b) for a, b in zip(live, desired, strict=True))
        )
    return bool(live == desired)
