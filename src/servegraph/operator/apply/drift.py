"""Whether a live RayService is still what the operator applied (pure).

Compared when the watch delivers the object, not on every reconcile: the result
is kept as a small `Live` record, so a thousand RayServices are not held in
memory and a reconcile triggered by KubeRay's status updates compares two keys.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from servegraph.names import KIND, SPEC_HASH_ANNOTATION
from servegraph.operator.packed import pack, pack_bytes, unpack, unpack_bytes
from servegraph.operator.rollout.blockers import mirror_pending
from servegraph.operator.status.report import mirror_applications, mirror_upgrade

MatchKey = tuple[Any, ...]
"""(spec hash, owner uid) of a rendered RayService: equal keys, nothing to write."""


def text_digest(text: str) -> str:
    """What a Serve config text is compared by, instead of holding the text (~11 KiB each)."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


@dataclass
class Desired:
    """The RayService rendered from the last good graph, and what it was rendered from.

    Its Serve config text is most of the manifest and is read only to apply (when it
    changed): it is kept compressed (~1/6 of the text), and compared by its digest."""

    frame: dict[str, Any]
    """The manifest without spec.serveConfigV2."""
    serve_packed: bytes
    serve_digest: str
    render_key: tuple[Any, ...]
    """(graph digest, ServeGraph uid, generation): render again when it changes."""
    match_key: MatchKey
    """(spec hash, owner uid): what a live RayService is compared by."""
    size: int = 0
    """Bytes of the manifest as JSON (objectsize.manifest_bytes): over the limit it is never applied."""

    @classmethod
    def of(
        cls, manifest: Mapping[str, Any], render_key: tuple[Any, ...], match_key: MatchKey, size: int = 0
    ) -> Desired:
        spec = dict(manifest["spec"])
        text = str(spec.pop("serveConfigV2", ""))
        packed = pack_bytes(text.encode())
        return cls({**manifest, "spec": spec}, packed, text_digest(text), render_key, match_key, size)

    def manifest(self) -> dict[str, Any]:
        """The whole RayService, to apply."""
        text = unpack_bytes(self.serve_packed).decode()
        return {**self.frame, "spec": {**self.frame["spec"], "serveConfigV2": text}}


@dataclass(frozen=True)
class Owner:
    """The controller owner reference of a RayService: who may write it."""

    kind: str
    name: str
    uid: str


@dataclass(frozen=True)
class Live:
    """What a reconcile needs of a live RayService, kept instead of the object.

    `matched` is the MatchKey of the desired RayService the object was found to
    match when it was compared (None: it did not, or nothing was desired yet).
    """

    matched: MatchKey | None
    applications: dict[str, Any]
    compared: bool = True
    """False when nothing was desired yet to compare with (the reconcile then reads it)."""
    upgrade: dict[str, Any] | None = None
    """KubeRay's new-cluster upgrade in progress, if any (status.mirror_upgrade)."""
    pending: dict[str, Any] | None = None
    """The Ray cluster KubeRay is starting, its applications and their messages, bounded
    (blockers.mirror_pending): why a first rollout or an upgrade is stuck."""
    owner: Owner | None = None
    managers: tuple[str, ...] = ()
    """The field managers that wrote it: who made it, when no controller owns it."""
    settled: bool = False
    """KubeRay has acted on the object's current spec (status.observedGeneration caught up)."""
    packed_cluster: bytes | None = None
    """The live rayClusterConfig (`cluster`), packed: ~8 KiB as dicts, ~0.5 KiB so."""
    serve_digest: str = ""
    """`text_digest` of the live serveConfigV2: whether an apply changes it."""
    raw: dict[str, Any] | None = None
    """The object itself, only while it was not compared (start-up): compared on first use."""
    deleting: bool = False
    """Deleted, waiting for KubeRay's finalizer (it removes the Ray clusters first)."""
    resource_version: str | None = None
    """The version this record was made from: a write carrying it lands only on that object
    (ownership.apply_owned), so what was decided from this record still holds."""

    @property
    def cluster(self) -> dict[str, Any] | None:
        """The live rayClusterConfig: new renders keep its worker-group order, predictions read it."""
        return None if self.packed_cluster is None else dict(unpack(self.packed_cluster))


def live_record(
    body: Mapping[str, Any], matched: MatchKey | None, compared: bool = True, serve_digest: str | None = None
) -> Live:
    """A `Live` from a RayService as the API server returned or the watch delivered it
    (`serve_digest`: its Serve config's, when the caller has it already)."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    spec = body.get("spec") or {}
    owner, managers = _whose(meta)
    return Live(
        matched,
        mirror_applications(body),
        compared=compared,
        upgrade=mirror_upgrade(body),
        pending=mirror_pending(body),
        owner=owner,
        managers=managers,
        settled=int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 0) > 0,
        packed_cluster=None if spec.get("rayClusterConfig") is None else pack(spec["rayClusterConfig"]),
        serve_digest=serve_digest if serve_digest is not None else live_digest(body),
        raw=None if compared else dict(body),
        deleting=bool(meta.get("deletionTimestamp")),
        resource_version=str(meta["resourceVersion"]) if meta.get("resourceVersion") else None,
    )


def stranger(body: Mapping[str, Any]) -> Live:
    """What is kept of a RayService no ServeGraph renders (no graph label, no ServeGraph owner):
    that it exists and whose it is, enough to refuse it as a `conflict` without reading it."""
    meta = body.get("metadata") or {}
    owner, managers = _whose(meta)
    version = str(meta["resourceVersion"]) if meta.get("resourceVersion") else None
    deleting = bool(meta.get("deletionTimestamp"))
    return Live(None, {}, owner=owner, managers=managers, deleting=deleting, resource_version=version)


def _whose(meta: Mapping[str, Any]) -> tuple[Owner | None, tuple[str, ...]]:
    """The controller owner reference, and the field managers that wrote the object (not KubeRay's status)."""
    owner = next(
        (
            Owner(str(o.get("kind", "")), str(o.get("name", "")), str(o.get("uid", "")))
            for o in meta.get("ownerReferences") or ()
            if o.get("controller")
        ),
        None,
    )
    managers = {
        str(m["manager"]) for m in meta.get("managedFields") or () if m.get("manager") and not m.get("subresource")
    }
    return owner, tuple(sorted(managers))


def live_of(body: Mapping[str, Any], desired: Desired | None) -> Live:
    """Condense a watched or read RayService, comparing it with the desired one if there is one yet."""
    if desired is None:
        return live_record(body, None, compared=False)
    digest = live_digest(body)
    return live_record(body, desired.match_key if up_to_date(body, desired, digest) else None, serve_digest=digest)


def conflict(live: Live, namespace: str, name: str, uid: str) -> str | None:
    """Why the ServeGraph with this uid must not write the live RayService, or None.

    Only the RayService's controller may write it: a RayService someone made by hand,
    or one another ServeGraph controls, is refused rather than taken over.
    """
    if live.owner is not None and live.owner.kind == KIND and live.owner.uid == uid:
        return None
    where = f"RayService {namespace}/{name}"
    if live.owner is not None:
        return (
            f"{where} is controlled by {live.owner.kind} {namespace}/{live.owner.name}, not this ServeGraph; "
            "set spec.rayService.name to another name"
        )
    made = ", ".join(live.managers) or "another client"
    return (
        f"{where} exists and no ServeGraph controls it (written by {made}); delete it to let this ServeGraph "
        "create its own, or set spec.rayService.name to another name"
    )


def live_digest(live: Mapping[str, Any]) -> str:
    return text_digest(str((live.get("spec") or {}).get("serveConfigV2") or ""))


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
