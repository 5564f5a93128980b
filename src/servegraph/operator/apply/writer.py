"""The apply step: whose the RayService is, and writing it when it is ours and out of date.

Split from the reconcile so each reads on one screen. Everything here acts on one
RayService through the `ApiServer` edge and the watch cache; what the status says
about it is returned as an `Outcome` for `status.report`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from servegraph.kube import KubeError
from servegraph.names import ConditionType, Key
from servegraph.operator.apply.drift import live_of
from servegraph.operator.apply.objectsize import too_large
from servegraph.operator.apply.ownership import NotOurs, apply_owned, conflict
from servegraph.operator.cache import WatchCache
from servegraph.operator.conditions import Condition
from servegraph.operator.kuberay import Live, live_record
from servegraph.operator.metrics import Metrics
from servegraph.operator.protocols import ApiServer
from servegraph.operator.values import Desired, Event, Outcome
from servegraph.render.upgrade import predict

log = logging.getLogger("servegraph.operator")

APPLY_ATTEMPTS = 2
"""Read-then-apply attempts per reconcile when the RayService changed between the read and
the write (KubeRay's status); an update first tries once on the record it holds, unread."""


class RayServiceWriter:
    """Reads, checks and applies one ServeGraph's RayService."""

    def __init__(self, api: ApiServer, cache: WatchCache, metrics: Metrics) -> None:
        self.api = api
        self.cache = cache
        self.metrics = metrics

    async def owned_live(self, key: Key, body: Mapping[str, Any], rs_name: str) -> Owned:
        """The live RayService of that name if this ServeGraph may write it; else why not; and
        what the step found (a `Conflict` or a failed read, each to be retried).

        In this process one ServeGraph renders a given name (the first to claim it), and
        only a RayService this ServeGraph controls, or none, is written: one made by hand
        or controlled by another ServeGraph is `Conflict`, never taken over.
        """
        namespace = key[0]
        holder = self.cache.claim((namespace, rs_name), key)
        clash = None
        live = None
        if holder is not None:
            clash = (
                f"RayService {namespace}/{rs_name} is rendered by ServeGraph {holder[0]}/{holder[1]}, "
                "not this ServeGraph; set spec.rayService.name to another name"
            )
        else:
            live, found = await self.get_live(namespace, rs_name)
            if found.retry:
                return Owned(None, None, found)
            if live is not None:
                clash = conflict(live, namespace, rs_name, body["metadata"]["uid"])
        if clash is not None:
            return Owned(None, clash, _failed("Conflict", clash))
        return Owned(live, None, Outcome())

    async def _read(self, where: Key, desired: Desired) -> Live | None:
        """The RayService as the API server has it now, compared with the desired one (None: gone)."""
        body = await self.api.get_rayservice(*where)
        return None if body is None else live_of(body, desired)

    async def get_live(self, namespace: str, name: str) -> tuple[Live | None, Outcome]:
        cached = self.cache.rayservice((namespace, name))
        if cached is None or isinstance(cached, Live):
            return cached, Outcome()
        if self.cache.absent((namespace, name)):
            return None, Outcome()  # the watch delivers every RayService: one it never delivered does not exist
        try:  # not delivered by the watch yet (start-up), or forgotten after a refused write: read it once
            body = await self.api.get_rayservice(namespace, name)
        except KubeError as exc:
            return None, _failed("ReadFailed", str(exc))
        live = None if body is None else live_of(body, None)
        self.cache.put_rayservice((namespace, name), live)
        return live, Outcome()

    async def apply(
        self, key: Key, uid: str, desired: Desired, live: Live | None, may_write: Callable[[], bool]
    ) -> Applied:
        """Apply the desired RayService unless it is live already."""
        meta = desired.frame["metadata"]
        name, where = meta["name"], (meta["namespace"], meta["name"])
        if live is not None and live.matched is not None and live.matched == desired.match_key:
            return Applied(live, Outcome(applied=_up_to_date(name)))
        refused = too_large(name, desired.size)
        if refused is not None:  # the same on every retry: said once, tried again for a new render
            return Applied(live, Outcome(applied=refused))
        # Compares the cluster specs, and the Serve config texts only for equality (so their
        # digests stand in for them): a millisecond at 10,000 nodes.
        old = None if live is None else {"spec": {"rayClusterConfig": live.cluster, "serveConfigV2": live.serve_digest}}
        new = {**desired.frame, "spec": {**desired.frame["spec"], "serveConfigV2": desired.serve_digest}}
        prediction = predict(old, new, applications=False)
        events: tuple[Event, ...] = ()
        if prediction.new_cluster:
            events = (Event("Normal", "NewClusterUpgrade", f"RayService {name}: {prediction.summary()}"),)
        # The first write over an existing RayService is decided on the record held (our last
        # apply's answer, or the watch's since): no read unless that version is stale.
        known = live if live is not None and live.resource_version is not None else None
        manifest = desired.manifest()
        for _ in range(APPLY_ATTEMPTS + (known is not None)):
            if not may_write():
                return Applied(live, Outcome(events=events))
            try:
                applied = await apply_owned(self.api, manifest, uid, live is not None, known)
            except NotOurs as exc:
                self.cache.put_rayservice(where, exc.live)  # what the watch may never deliver (label removed)
                return Applied(None, _failed("Conflict", exc.reason, events), exc.reason, prediction.kind)
            except KubeError as exc:
                if exc.status == 409 and live is not None:
                    # Changed since the version decided on: read it again, and decide again. The
                    # record may have been older than this operator's own last write (a re-list
                    # begun before it, a watch event delivered after its answer): then the write
                    # is done already, and writing it again would write one change twice.
                    try:
                        known = await self._read(where, desired)
                    except KubeError as read:
                        return Applied(live, _failed("Conflict", str(read), events), None, prediction.kind)
                    if known is not None and known.matched == desired.match_key:
                        self.cache.put_rayservice(where, known)
                        return Applied(known, Outcome(applied=_up_to_date(name)))
                    continue
                if exc.status == 409:
                    self.cache.forget_rayservice(where)  # read it next time, and see whose it is
                reason = "Conflict" if exc.status == 409 else "ApplyFailed"
                return Applied(live, _failed(reason, str(exc), events), None, prediction.kind)
            break
        else:
            self.cache.forget_rayservice(where)
            changed = f"RayService {name} changed while it was being written; read again"
            return Applied(live, _failed("Conflict", changed, events), None, prediction.kind)
        self.metrics.writes.labels("rayservice").inc()
        record = live_record(applied, desired.match_key)
        self.cache.put_applied(where, record)
        verb = "created" if live is None else "updated"
        log.info("[%s/%s] %s RayService %s", key[0], key[1], verb, name)
        done = Outcome(
            applied=_up_to_date(name), events=(*events, Event("Normal", "Applied", f"{verb} RayService {name}"))
        )
        return Applied(record, done, None, prediction.kind)


@dataclass(frozen=True)
class Owned:
    """The ownership step: the live RayService this ServeGraph may write (None: none exists, or
    it may not), why it may not (None when it may), and what the step found."""

    live: Live | None
    clash: str | None
    found: Outcome


@dataclass(frozen=True)
class Applied:
    """What the apply step left: the live record, what it found, why the RayService is not
    ours to write (or None), and what KubeRay will make of the change — `predict`'s kind —
    or None when nothing was written."""

    live: Live | None
    found: Outcome
    clash: str | None = None
    upgrade: str | None = None


def _up_to_date(name: str) -> Condition:
    return Condition(ConditionType.APPLIED, True, "UpToDate", f"RayService {name} matches the graph and spec")


def _failed(reason: str, message: str, events: tuple[Event, ...] = ()) -> Outcome:
    """Applied=False for `reason`, retried with backoff."""
    return Outcome(applied=Condition(ConditionType.APPLIED, False, reason, message), events=events, retry=True)
