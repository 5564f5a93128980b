"""Writing a RayService only while it is this ServeGraph's, decided on the object written.

The watch cannot be trusted with ownership: a RayService whose label was removed by
hand is no longer delivered, so the record kept of it says "ours" for ever. So a write
over an existing RayService carries the resourceVersion of the object its controller was
checked on (`conflict`): the API server refuses the write (409) if anyone changed
the object since, so the check and the write are one atomic step. The check is made on
the record the caller already holds when it has one (what our last apply answered, or
what the watch delivered since), so an update costs no read; when that version is stale
(KubeRay's status writes move it too, and a hand edit the watch never delivers) the write
is refused, and the caller reads the object and decides again. One believed absent is
created without force: one made meanwhile by someone else is refused — 409 for a field
conflict, 422 when it names another controller in its ownerReferences (two controllers are
invalid; found by the contract suite on the real API server) — and the next reconcile
decides on the object the watch delivers. Deleting
(spec.suspend) is decided the same way: on the object as read, the delete carrying its
uid and resourceVersion as preconditions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servegraph.names import KIND
from servegraph.operator.kuberay import Live, live_record
from servegraph.operator.protocols import RayServiceApi


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


class NotOurs(Exception):
    """The RayService, read just before writing it, is not this ServeGraph's."""

    def __init__(self, live: Live, reason: str) -> None:
        super().__init__(reason)
        self.live = live
        self.reason = reason


async def apply_owned(
    api: RayServiceApi, manifest: Mapping[str, Any], owner_uid: str, exists: bool, known: Live | None = None
) -> dict[str, Any]:
    """Apply `manifest` for the ServeGraph `owner_uid`; the object as the API server returns it.

    `known`: the record of the existing object the caller holds; with its resourceVersion,
    ownership is decided on it and the object is not read. Raises NotOurs for a RayService
    another controller (or nobody) controls, and KubeError 409 when it changed between the
    version decided on and the write (read it again and decide again).
    """
    meta = manifest["metadata"]
    if exists and known is not None and known.resource_version is not None:
        reason = conflict(known, meta["namespace"], meta["name"], owner_uid)
        if reason is not None:
            raise NotOurs(known, reason)
        manifest = {**manifest, "metadata": {**meta, "resourceVersion": known.resource_version}}
        return await api.apply_rayservice(manifest, force=True)
    if exists:
        current = await api.get_rayservice(meta["namespace"], meta["name"])
        if current is not None:
            record = live_record(current, None)
            reason = conflict(record, meta["namespace"], meta["name"], owner_uid)
            if reason is not None:
                raise NotOurs(record, reason)
            version = (current.get("metadata") or {}).get("resourceVersion")
            manifest = {**manifest, "metadata": {**meta, "resourceVersion": version}}
        exists = current is not None
    return await api.apply_rayservice(manifest, force=exists)


async def delete_owned(api: RayServiceApi, namespace: str, name: str, owner_uid: str) -> bool:
    """Delete the RayService if it is the ServeGraph `owner_uid`'s; False when there was nothing
    to delete (absent, or being deleted already).

    Raises NotOurs for a RayService someone else controls, and KubeError 409 when it changed
    between the read and the delete.
    """
    current = await api.get_rayservice(namespace, name)
    if current is None:
        return False
    record = live_record(current, None)
    reason = conflict(record, namespace, name, owner_uid)
    if reason is not None:
        raise NotOurs(record, reason)
    if record.deleting:
        return False
    meta = current.get("metadata") or {}
    await api.delete_rayservice(namespace, name, str(meta.get("uid")), str(meta.get("resourceVersion")))
    return True
