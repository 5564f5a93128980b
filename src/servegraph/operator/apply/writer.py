"""The apply step: whose the RayService is, and writing it when it is ours and out of date.

Split from the reconcile so each reads on one screen. Everything here acts on one
RayService through the `ApiServer` edge and the watch cache; what the status says
about it is left in the `Outcome` for `status.report`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from servegraph.kube import KubeError
from servegraph.names import ConditionType, Key
from servegraph.operator.apply.drift import Desired, Live, conflict, live_of, live_record
from servegraph.operator.apply.objectsize import too_large
from servegraph.operator.apply.ownership import NotOurs, apply_owned
from servegraph.operator.cache import WatchCache
from servegraph.operator.protocols import ApiServer
from servegraph.operator.run.metrics import Metrics
from servegraph.operator.status.conditions import Condition
from servegraph.operator.status.report import Event, Outcome
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

    async def owned_live(
        self, key: Key, body: Mapping[str, Any], rs_name: str, out: Outcome
    ) -> tuple[Live | None, str | None]:
        """The live RayService of that name if this ServeGraph may write it; else why not.

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
            live = await self.get_live(namespace, rs_name, out)
            if live is not None:
                clash = conflict(live, namespace, rs_name, body["metadata"]["uid"])
        if clash is not None:
            out.applied = Condition(ConditionType.APPLIED, False, "Conflict", clash)
            out.retry = True
            return None, clash
        return live, None

    async def get_live(self, namespace: str, name: str, out: Outcome) -> Live | None:
        cached = self.cache.rayservice((namespace, name))
        if cached is None or isinstance(cached, Live):
            return cached
        if self.cache.absent((namespace, name)):
            return None  # the watch delivers every RayService: one it never delivered does not exist
        try:  # not delivered by the watch yet (start-up), or forgotten after a refused write: read it once
            body = await self.api.get_rayservice(namespace, name)
        except KubeError as exc:
            out.applied = Condition(ConditionType.APPLIED, False, "ReadFailed", str(exc))
            out.retry = True
            return None
        live = None if body is None else live_of(body, None)
        self.cache.put_rayservice((namespace, name), live)
        return live

    async def apply(
        self,
        key: Key,
        uid: str,
        desired: Desired,
        live: Live | None,
        out: Outcome,
        may_write: Callable[[], bool],
    ) -> tuple[Live | None, str | None, str | None]:
        """Apply the desired RayService unless it is live already; (the live record, why it is
        not ours to write or None, what KubeRay will make of the change — `predict`'s kind —
        or None when nothing is written)."""
        meta = desired.manifest["metadata"]
        name, where = meta["name"], (meta["namespace"], meta["name"])
        if live is not None and live.matched is not None and live.matched == desired.match_key:
            out.applied = Condition(
                ConditionType.APPLIED, True, "UpToDate", f"RayService {name} matches the graph and spec"
            )
            return live, None, None
        refused = too_large(name, desired.size)
        if refused is not None:  # the same on every retry: said once, tried again for a new render
            out.applied = refused
            return live, None, None
        old = None if live is None else {"spec": {"rayClusterConfig": live.cluster, "serveConfigV2": live.serve_config}}
        # Compares the cluster specs and the Serve config texts only: a millisecond at 10,000 nodes.
        prediction = predict(old, desired.manifest, applications=False)
        if prediction.new_cluster:
            out.events.append(Event("Normal", "NewClusterUpgrade", f"RayService {name}: {prediction.summary()}"))
        # The first write over an existing RayService is decided on the record held (our last
        # apply's answer, or the watch's since): no read unless that version is stale.
        held = live if live is not None and live.resource_version is not None else None
        for attempt in range(APPLY_ATTEMPTS + (held is not None)):
            if not may_write():
                return live, None, None
            try:
                known = held if attempt == 0 else None
                applied = await apply_owned(self.api, desired.manifest, uid, live is not None, known)
            except NotOurs as exc:
                self.cache.put_rayservice(where, exc.live)  # what the watch may never deliver (label removed)
                out.applied = Condition(ConditionType.APPLIED, False, "Conflict", exc.reason)
                out.retry = True
                return None, exc.reason, prediction.kind
            except KubeError as exc:
                if exc.status == 409 and live is not None:
                    continue  # changed since it was read: read it again, and decide again
                reason = "Conflict" if exc.status == 409 else "ApplyFailed"
                if exc.status == 409:
                    self.cache.forget_rayservice(where)  # read it next time, and see whose it is
                out.applied = Condition(ConditionType.APPLIED, False, reason, str(exc))
                out.retry = True
                return live, None, prediction.kind
            break
        else:
            self.cache.forget_rayservice(where)
            out.applied = Condition(
                ConditionType.APPLIED,
                False,
                "Conflict",
                f"RayService {name} changed while it was being written; read again",
            )
            out.retry = True
            return live, None, prediction.kind
        self.metrics.writes.labels("rayservice").inc()
        record = live_record(applied, desired.match_key)
        self.cache.put_rayservice(where, record)
        verb = "created" if live is None else "updated"
        log.info("[%s/%s] %s RayService %s", key[0], key[1], verb, name)
        out.events.append(Event("Normal", "Applied", f"{verb} RayService {name}"))
        out.applied = Condition(
            ConditionType.APPLIED, True, "UpToDate", f"RayService {name} matches the graph and spec"
        )
        return record, None, prediction.kind
