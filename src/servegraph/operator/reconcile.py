"""The reconcile: fetch → graph → rollout → render → apply → status, for one ServeGraph.

Level-triggered: the desired RayService is a function of the spec, the graph the
rollout runs (the last valid download, or a kept one: rollback, pin) and nothing
else, so any trigger may run it any number of times. A failed download or an
invalid graph changes conditions, never the running RayService. In steady state it
reads nothing but the RayService and writes nothing at all.

The reconciler composes the I/O it is given (`protocols`): an `ApiServer`, a `Fetcher`,
a `Parser`, the `WatchCache` and the work queue. Which version to run is
`rollout.step.Rollouts`' answer; whose the RayService is and its write, `writer`'s; what
the status says, `status.report`'s (pure). Nothing is written for a ServeGraph
deleted or replaced meanwhile (re-checked before every write; the status write
carries a uid precondition), and no namespace holds more than its share of downloads.

Every step's unexpected exception ends the same way as the download's: a condition
naming its type (never its message, which could carry anything), the Warning Event
of that transition, `servegraph_internal_errors_total` and a retry with backoff.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from servegraph.evidence import Reader
from servegraph.kube import KubeError
from servegraph.names import GRAPH_LABEL, GROUP, KIND, REFRESH_ANNOTATION, ConditionType, Key
from servegraph.operator import conditions
from servegraph.operator.apply.drift import live_of
from servegraph.operator.cache import SERVEGRAPHS, Memory, WatchCache
from servegraph.operator.conditions import Condition
from servegraph.operator.deploying import Deployed, Deployer
from servegraph.operator.fetch.download import Downloader, needs_fetch
from servegraph.operator.fetch.downloads import Downloads
from servegraph.operator.fetch.parsing import parse_here
from servegraph.operator.gateways import GatewayPolicy
from servegraph.operator.kuberay import stranger
from servegraph.operator.metrics import Metrics
from servegraph.operator.protocols import ApiServer, Fetcher, Parser, RouteApi
from servegraph.operator.queue import WorkQueue
from servegraph.operator.rollout import store
from servegraph.operator.rollout.step import Rollouts
from servegraph.operator.secrets import SecretCache
from servegraph.operator.spec import SpecError, parse_spec
from servegraph.operator.status.report import report
from servegraph.operator.unexpected import message, unexpected
from servegraph.operator.values import Event, Observed, Outcome
from servegraph.render.kuberay_features import KubeRayFeatures
from servegraph.render.rayservice import rayservice_name
from servegraph.source import Limits

log = logging.getLogger("servegraph.operator")


class RetryLater(Exception):
    """The reconcile did what it could; run it again after a backoff."""


class Reconciler:
    def __init__(
        self,
        api: ApiServer,
        fetcher: Fetcher,
        metrics: Metrics,
        queue: WorkQueue[Key],
        cache: WatchCache | None = None,
        *,
        parser: Parser = parse_here,
        limits: Limits | None = None,
        fetches_per_namespace: int = 2,
        max_downloads: int = 64,
        secret_ttl_s: float = 10.0,
        serve_service_types: frozenset[str] = frozenset(),
        serve_service_annotations: tuple[str, ...] = (),
        owns: Callable[[Mapping[str, Any]], bool] = lambda _: True,
        kuberay: KubeRayFeatures | None = None,
        routes: RouteApi | None = None,
        gateways: GatewayPolicy | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        evidence: Reader | None = None,
        watched: Collection[str] | None = None,
    ) -> None:
        self.api = api
        self._lists_due: set[str | None] | None = (
            {None} if watched is None else None if any(c in n for n in watched for c in "*?[") else set(watched)
        )
        """The ServeGraph lists the watches make at the start: one cluster-wide, or one per namespace
        watched; None: any one (globs, whose namespaces are not known here)."""
        self._lists_seen = False
        self._undelivered: set[Key] = set()
        """Listed ServeGraphs not yet delivered to `servegraph_changed`."""
        self.monotonic = monotonic
        """Seconds that never go back, for polls, retries and the Secret cache (a test moves its
        own); a reconcile's duration is measured on the real one."""
        self.owns = owns
        """Whether a ServeGraph is this shard's (`sharding.Shard.owns`): checked with `_current`."""
        self.serve_service_types = serve_service_types
        """Service types the administrator allows a serveService besides ClusterIP."""
        self.serve_service_annotations = serve_service_annotations
        """Prefixes of the annotations the administrator allows a serveService (none by default)."""
        self.metrics = metrics
        self.queue = queue
        self.cache = cache or WatchCache()
        self.secrets = SecretCache(api.read_secret_data, ttl_s=secret_ttl_s, monotonic=monotonic)
        self.downloader = Downloader(
            fetcher,
            parser,
            self.secrets,
            api,
            limits or Limits(),
            self.cache,
            queue.min_retry_delay_s,
            unexpected=lambda exc: metrics.internal_error("download", exc),
            monotonic=monotonic,
        )
        self.downloads = Downloads(self.downloader.run, queue.add, fetches_per_namespace, max_downloads)
        """Downloads run beside the workers, never in them (fetch/downloads.py)."""
        self.rollouts = Rollouts(api, parser, self.cache, metrics, wall=wall, evidence=evidence)
        """Rollout times are written to the status, for any later leader: on the `wall` clock."""
        self.deployer = Deployer(api, self.cache, metrics, self.rollouts, monotonic, kuberay, routes)
        self.gateways = gateways or GatewayPolicy()
        """The Gateways and gateway classes the administrator allows (none by default)."""
        metrics.watch_conditions(self.cache.condition_pairs)
        metrics.watch_downloads(self.downloads.running, self.downloads.waiting)
        metrics.watch_servegraphs(lambda key: self.cache.head(key) is not None)

    # -- triggers: each only records what changed and queues the key -------------

    def servegraph_changed(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        self._undelivered.discard(key)
        if not deleted and self.cache.echo_servegraph(key, body["metadata"].get("resourceVersion")):
            return  # our status write's answer, delivered back: held already
        if deleted:
            self.cache.forget_servegraph(key)
            self.queue.discard(key)
            self.downloads.cancel(key)
            self.metrics.forget(key)
            return
        self.cache.put_servegraph(body)
        self.queue.add(key)

    def rayservice_changed(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        """A RayService changed or vanished: repair drift, mirror status. One no ServeGraph
        renders (no graph label, no ServeGraph owner) is only recorded: whose it is."""
        meta = body.get("metadata") or {}
        namespace = meta.get("namespace", "")
        where = (namespace, meta.get("name", ""))
        if not deleted and self.cache.echo_rayservice(where, meta.get("resourceVersion")):
            return  # our apply's answer, delivered back: held already
        owners = [
            (namespace, o.get("name", ""))
            for o in meta.get("ownerReferences") or ()
            if o.get("kind") == KIND and o.get("apiVersion", "").startswith(f"{GROUP}/")
        ]
        if not owners and GRAPH_LABEL not in (meta.get("labels") or {}):
            self.cache.put_rayservice(where, None if deleted else stranger(body))
            return
        memory = self.cache.peek_memory(owners[0]) if owners else None
        desired = memory.desired if memory is not None else None
        self.cache.put_rayservice(where, None if deleted else live_of(body, desired))
        for key in owners:
            if self.cache.head(key) is not None:
                self.queue.add(key)

    def httproute_changed(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        """One of the operator's HTTPRoutes changed or vanished: recorded, and its ServeGraph queued
        (an edit or a deletion is repaired; a Gateway's verdict is said)."""
        owner = self.deployer.routes.seen(body, deleted)
        if owner is not None and self.cache.head(owner) is not None:
            self.queue.add(owner)

    def listing(self) -> int:
        """A watch begins to list its objects (the start, or after a gap: 410 Gone)."""
        return self.cache.listing()

    def relisted(self, kind: str, namespace: str | None, listed: Collection[Key], since: int) -> None:
        """A watch's list ended (`since`: what `listing` said as it began): what it no longer
        returns was deleted in a gap no watch delivered, and is forgotten or repaired like a
        delivered deletion — a RayService deleted meanwhile is created again, never left
        reported UpToDate (issue 44)."""
        if kind == SERVEGRAPHS:
            self._listed(namespace, listed)
        for key in self.cache.vanished(kind, namespace, listed, since):
            if kind == SERVEGRAPHS:
                head = self.cache.head(key)
                if head is not None:
                    log.info("[%s/%s] deleted while unwatched: forgotten", *key)
                    self.servegraph_changed(head, deleted=True)
                continue
            log.info("RayService %s/%s deleted while unwatched: repairing", *key)
            self.cache.put_rayservice(key, None)
            owner = self.cache.claimant(key)
            if owner is not None and self.cache.head(owner) is not None:
                self.queue.add(owner)

    def _listed(self, namespace: str | None, listed: Collection[Key]) -> None:
        if self._lists_due is not None:
            self._lists_due.discard(namespace)
        self._lists_seen = True
        self._undelivered.update(key for key in listed if self.cache.head(key) is None)

    def servegraphs_synced(self) -> bool:
        """Whether the watches' first lists of ServeGraphs ended and what they returned was
        delivered: until then a "graph published" event matched against the cache would miss
        ServeGraphs, and be acknowledged for none (the events endpoint answers 503 meanwhile)."""
        due = self._lists_due
        return self._lists_seen and (due is None or not due) and not self._undelivered

    def resync_all(self) -> None:
        """Queue every known ServeGraph (a new leader catches up on what it missed), each
        reconciled from what the API server holds: any memory of an earlier leadership is
        dropped first (`WatchCache.forget_memories`)."""
        self.cache.forget_memories()
        for key in self.cache.servegraph_keys():
            self.queue.add(key)

    # -- the reconcile ------------------------------------------------------------

    async def reconcile(self, key: Key) -> float | None:
        """One pass; returns seconds until the next poll, or raises RetryLater."""
        body = self.cache.body(key)
        if body is None:
            return None
        start = time.monotonic()
        self.metrics.reconciling(key)
        result = "error"
        try:
            delay = await self._reconcile(key, body)
            result = "success"
            return delay
        except RetryLater:
            result = "retry"
            raise
        except Exception as exc:  # escaped every step: the status could not be written
            unexpected(key, "status", exc, self.metrics)
            if self._current(key, body):
                warning = Event("Warning", "InternalError", message(exc, "status"))
                await self._event(body, warning, conditions.now_rfc3339())
            result = "retry"
            raise RetryLater from None
        finally:
            self.metrics.observe_reconcile(key, result, time.monotonic() - start)

    def _current(self, key: Key, body: Mapping[str, Any]) -> bool:
        """Whether the ServeGraph read at the start is still there, the same object, and still
        this shard's: checked before every write, as a download or an API call may have let it
        be deleted, replaced or moved to another shard."""
        now = self.cache.head(key)
        return now is not None and now["metadata"].get("uid") == body["metadata"].get("uid") and self.owns(now)

    async def _reconcile(self, key: Key, body: dict[str, Any]) -> float | None:
        namespace, _ = key
        memory = self.cache.memory(key)
        try:
            spec = parse_spec(
                body.get("spec") or {},
                namespace,
                self.serve_service_types,
                self.serve_service_annotations,
                self.gateways,
            )
        except Exception as exc:
            if isinstance(exc, SpecError):
                out = Outcome(fetched=Condition(ConditionType.FETCHED, False, "InvalidSpec", str(exc)))
            else:
                out = unexpected(key, "spec", exc, self.metrics)
            await self._write_status(
                key, body, memory, Observed(out, None, None, None, None, still_current=frozenset())
            )
            if out.retry:
                raise RetryLater from None
            return None
        may_write = lambda: self._current(key, body)  # noqa: E731
        if spec.suspend:
            self.downloads.cancel(key)  # nothing is downloaded while suspended
            observed = await self.deployer.suspend(key, body, spec, memory, may_write)
            await self._write_status(key, body, memory, observed)
            if observed.outcome.retry:
                raise RetryLater
            return None  # no poll while suspended

        out = Outcome()
        refresh = (body["metadata"].get("annotations") or {}).get(REFRESH_ANNOTATION)
        if needs_fetch(memory, spec.source, refresh, self.monotonic()):
            finished = self.downloads.take(key, spec.source, refresh)
            if finished is None:  # asked for: its end queues the ServeGraph again
                self.downloads.start(key, memory, spec.source, refresh)
                asked = memory.fetch.source != spec.source or memory.fetch.refresh != refresh
                if asked or (memory.good is None and not (body.get("status") or {}).get("rollout")):
                    # A download this change asked for (a new source or refresh, often with a spec
                    # change): what it brings is applied with the spec, once, not the old graph
                    # first. And with nothing to apply yet, a status now would only say "not
                    # downloaded yet", then the real one, an Event each. A poll or a retry holds nothing.
                    return None
            elif finished.result is not None:
                finished.result.record(memory)  # only now: a download that never ended records nothing
                if finished.result.good is not None:
                    memory.unkept = finished.result.good.size <= store.BUDGET  # the rollout keeps it
                out = finished.result.outcome
            else:  # outside the download's own handling (its bookkeeping)
                assert finished.error is not None
                out = unexpected(key, "download", finished.error, self.metrics)

        deployed = Deployed(None, None, None, None, out)
        rs_name: str | None = None
        if memory.good is not None or (body.get("status") or {}).get("rollout"):
            rs_name = rayservice_name(spec.ray_service.name or body["metadata"]["name"])
            deployed = await self.deployer.deploy(key, body, spec, memory, rs_name, out, may_write)
            out = deployed.found
        live, decision, target = deployed.live, deployed.decision, deployed.target
        if memory.good is None and target is None and out.applied is None:
            no_graph = Condition(ConditionType.APPLIED, False, "NoValidGraph", "no valid graph has been downloaded yet")
            out = out.then(Outcome(applied=no_graph))
        for cond in out.conditions():
            memory.computed_for[cond.type] = spec.source
        observed = Observed(
            outcome=out,
            good=target,
            etag=memory.fetch.etag,
            rayservice=rs_name,
            applications=live.applications if live is not None else None,
            upgrade=live.upgrade if live is not None else None,
            pending=live.pending if live is not None else None,
            rollout=decision.rollout if decision is not None else None,
            history=decision.history if decision is not None else None,
            conflict=deployed.clash,
            layout=None
            if deployed.layout is None
            else {"base": deployed.layout.base.digest, "live": deployed.layout.serving.digest},
            still_current=frozenset(t for t, src in memory.computed_for.items() if src == spec.source),
        )
        await self._write_status(key, body, memory, observed)
        if out.retry:
            raise RetryLater
        delays = []
        if decision is not None:  # the rollout's deadline or stable window, a canary's next check
            delays += [decision.seconds_to_deadline(self.rollouts.wall()), self.rollouts.next_check(spec, decision)]
        if spec.source.poll_interval_s and not self.downloads.busy(key):  # else its end queues it
            delays.append(max(0.0, memory.fetch.poll_due - self.monotonic()))
        known = [d for d in delays if d is not None]
        return min(known) if known else None

    async def _write_status(self, key: Key, body: dict[str, Any], memory: Memory, observed: Observed) -> None:
        meta = body["metadata"]
        now = conditions.now_rfc3339()
        result = report(body.get("status") or {}, meta.get("generation", 0), observed, now)
        memory.conditions = {c["type"]: c["status"] for c in result.status["conditions"]}
        ns, name = key
        if not self._current(key, body):
            return  # gone or replaced: no write, and no metric series for it again
        self.metrics.observe_status((ns, name), body.get("status") or {}, result.status)
        if result.patch:
            try:
                written = await self.api.patch_servegraph_status(ns, name, meta["uid"], result.status)
            except KubeError as exc:
                if exc.status == 404 or exc.reason == "Replaced":
                    return  # deleted, or deleted and created again, meanwhile
                log.warning("[%s/%s] status update failed: %s", ns, name, exc)
                raise RetryLater from None
            self.metrics.writes.labels("status").inc()
            self.cache.put_status(key, meta["uid"], result.status, written)
            if result.transitions:  # one line per write: a create changes four conditions at once
                log.info("[%s/%s] %s", ns, name, conditions.one_line(result.transitions))
        for event in result.events:
            if self._current(key, body):
                await self._event(body, event, now)

    async def _event(self, body: dict[str, Any], event: Event, now: str) -> None:
        try:
            await self.api.post_event(body, event.type, event.reason, event.message, now)
            self.metrics.writes.labels("event").inc()
        except KubeError as exc:
            meta = body["metadata"]
            log.warning("[%s/%s] cannot post event %s: %s", meta["namespace"], meta["name"], event.reason, exc)
