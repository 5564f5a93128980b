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
from collections.abc import Callable, Mapping
from typing import Any

from servegraph.kube import KubeError
from servegraph.names import GRAPH_LABEL, GROUP, KIND, REFRESH_ANNOTATION, ConditionType, Key
from servegraph.operator.apply import rendering
from servegraph.operator.apply.drift import Live, live_of, stranger
from servegraph.operator.apply.writer import RayServiceWriter
from servegraph.operator.cache import Memory, WatchCache
from servegraph.operator.fetch.download import Downloader, needs_fetch
from servegraph.operator.fetch.parsing import parse_here
from servegraph.operator.fetch.secrets import SecretCache
from servegraph.operator.fetch.slots import NamespaceSlots
from servegraph.operator.protocols import ApiServer, Fetcher, Parser
from servegraph.operator.rollout import restart as restarts
from servegraph.operator.rollout import suspension
from servegraph.operator.rollout.decide import Decision
from servegraph.operator.rollout.step import Rollouts, with_upgrade
from servegraph.operator.run.metrics import Metrics
from servegraph.operator.run.queue import WorkQueue
from servegraph.operator.spec import ServeGraphSpec, SpecError, parse_spec
from servegraph.operator.status import conditions
from servegraph.operator.status.conditions import Condition
from servegraph.operator.status.report import Event, GoodGraph, Observed, Outcome, report
from servegraph.render.rayservice import rayservice_name
from servegraph.source import Limits

log = logging.getLogger("servegraph.operator")


class RetryLater(Exception):
    """The reconcile did what it could; run it again after a backoff."""


# Each step of a reconcile: the condition its unexpected exception is reported in, and what it was doing.
STEPS: dict[str, tuple[ConditionType | None, str]] = {
    "spec": (ConditionType.FETCHED, "reading the spec"),
    "download": (ConditionType.FETCHED, "downloading"),
    "ownership": (ConditionType.APPLIED, "checking who owns the RayService"),
    "rollout": (ConditionType.APPLIED, "planning the rollout"),
    "render": (ConditionType.APPLIED, "rendering the RayService"),
    "apply": (ConditionType.APPLIED, "applying the RayService"),
    "status": (None, "writing the status"),
}


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
        secret_ttl_s: float = 10.0,
        serve_service_types: frozenset[str] = frozenset(),
        owns: Callable[[Mapping[str, Any]], bool] = lambda _: True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.clock = clock
        """Monotonic seconds for polls, retries and the Secret cache (a test moves its own);
        a reconcile's duration is measured on the real clock."""
        self.owns = owns
        """Whether a ServeGraph is this shard's (`sharding.Shard.owns`): checked with `_current`."""
        self.serve_service_types = serve_service_types
        """Service types the administrator allows a serveService besides ClusterIP."""
        self.metrics = metrics
        self.queue = queue
        self.cache = cache or WatchCache()
        self.secrets = SecretCache(api.read_secret_data, ttl_s=secret_ttl_s, clock=clock)
        self.slots = NamespaceSlots(fetches_per_namespace, queue.add_first)
        self.downloader = Downloader(
            fetcher,
            parser,
            self.secrets,
            api,
            limits or Limits(),
            self.cache,
            queue.min_retry_delay_s,
            unexpected=lambda exc: metrics.internal_error("download", exc),
            clock=clock,
        )
        self.rollouts = Rollouts(api, parser, self.cache, metrics)
        self.writer = RayServiceWriter(api, self.cache, metrics)
        metrics.watch_conditions(self.cache.condition_pairs)
        metrics.watch_servegraphs(lambda key: self.cache.head(key) is not None)

    # -- triggers: each only records what changed and queues the key -------------

    def servegraph_changed(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if not deleted and self.cache.echo_servegraph(key, body["metadata"].get("resourceVersion")):
            return  # our status write's answer, delivered back: held already
        if deleted:
            self.cache.forget_servegraph(key)
            self.queue.discard(key)
            self.slots.forget(key)
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

    def resync_all(self) -> None:
        """Queue every known ServeGraph (a new leader catches up on what it missed)."""
        for key in self.cache.servegraph_keys():
            self.queue.add(key)

    # -- the reconcile ------------------------------------------------------------

    async def reconcile(self, key: Key) -> float | None:
        """One pass; returns seconds until the next poll, or raises RetryLater."""
        body = self.cache.body(key)
        if body is None:
            self.slots.done(key)  # a download slot's turn handed to it goes on
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
            self._unexpected(key, "status", exc)
            if self._current(key, body):
                warning = Event("Warning", "InternalError", _internal(exc, "status"))
                await self._event(body, warning, conditions.now_rfc3339())
            result = "retry"
            raise RetryLater from None
        finally:
            self.slots.done(key)  # a download slot's turn handed to it and not used goes on
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
            spec = parse_spec(body.get("spec") or {}, namespace, self.serve_service_types)
        except Exception as exc:
            if isinstance(exc, SpecError):
                out = Outcome(fetched=Condition(ConditionType.FETCHED, False, "InvalidSpec", str(exc)))
            else:
                out = self._unexpected(key, "spec", exc)
            await self._write_status(
                key, body, memory, Observed(out, None, None, None, None, still_current=frozenset())
            )
            if out.retry:
                raise RetryLater from None
            return None
        if spec.suspend:
            await self._suspended(key, body, spec, memory)
            return None  # no poll while suspended

        out = Outcome()
        refresh = (body["metadata"].get("annotations") or {}).get(REFRESH_ANNOTATION)
        if needs_fetch(memory, spec.source, refresh, self.clock()):
            if self.slots.acquire(key):
                try:
                    out = await self.downloader.run(key, memory, spec.source, refresh)
                except Exception as exc:  # outside the download's own handling (its bookkeeping)
                    out = self._unexpected(key, "download", exc)
                finally:
                    self.slots.release(key)
            elif memory.good is None and not (body.get("status") or {}).get("rollout"):
                # Parked with nothing to apply: a freed slot queues it again (fetch/slots.py), and a
                # status now would only say "not downloaded yet", then the real one, an Event each.
                return None
            if not self._current(key, body):
                return None  # deleted or replaced while downloading: write nothing for it

        live: Live | None = None
        rs_name = clash = None
        decision: Decision | None = None
        target: GoodGraph | None = None
        if memory.good is not None or (body.get("status") or {}).get("rollout"):
            rs_name = rayservice_name(spec.ray_service.get("name") or body["metadata"]["name"])
            live, clash, decision, target, applying = await self._apply(key, body, spec, memory, rs_name, out.retry)
            out = out.then(applying)
        if memory.good is None and target is None and out.applied is None:
            no_graph = Condition(ConditionType.APPLIED, False, "NoValidGraph", "no valid graph has been downloaded yet")
            out = out.then(Outcome(applied=no_graph))
        for cond in (out.fetched, out.valid, out.applied, out.progressing):
            if cond is not None:
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
            conflict=clash,
            still_current=frozenset(t for t, src in memory.computed_for.items() if src == spec.source),
        )
        await self._write_status(key, body, memory, observed)
        if out.retry:
            raise RetryLater
        delays = [decision.seconds_to_deadline(self.rollouts.clock())] if decision is not None else []
        if spec.source.poll_interval_s:
            delays.append(max(0.0, memory.fetch.poll_due - self.clock()))
        known = [d for d in delays if d is not None]
        return min(known) if known else None

    async def _apply(
        self, key: Key, body: dict[str, Any], spec: ServeGraphSpec, memory: Memory, rs_name: str, retrying: bool
    ) -> tuple[Live | None, str | None, Decision | None, GoodGraph | None, Outcome]:
        """Ownership → rollout → render → apply, each step's Outcome chained, stopping at the
        first that asks to retry: (the live RayService, why it is not ours, the rollout
        decision, the graph it runs, what the steps found)."""
        namespace = key[0]
        decision: Decision | None = None
        target: GoodGraph | None = None
        step = "ownership"
        out = Outcome(retry=retrying)
        live: Live | None = None
        clash: str | None = None
        try:
            live, clash, found = await self.writer.owned_live(key, body, rs_name)
            out = out.then(found)
            deleting = live is not None and live.deleting  # after a suspend: created again once gone
            if deleting:
                live = None
                waiting = f"RayService {rs_name} is deleting"
                out = out.then(Outcome(applied=Condition(ConditionType.APPLIED, None, "WaitingForDeletion", waiting)))
            if clash is not None or out.retry:
                return live, clash, decision, target, out
            step = "rollout"
            may_write = lambda: self._current(key, body)  # noqa: E731
            target, decision, memory.stored, found = await self.rollouts.plan(
                body, memory, spec.rollout, spec.source.url, live, may_write
            )
            out = out.then(found)
            memory.target = target
            stored = {h["digest"] for h in decision.history if h.get("rollbackAvailable")}
            if memory.good is not None and memory.good.digest in stored:
                memory.unkept = False  # in the store now: not written again
            if target is None or out.retry or deleting:
                return live, clash, decision, target, out
            step = "render"
            running = live.cluster if live is not None else None
            annotations = body["metadata"].get("annotations") or {}
            restart = restarts.decide(annotations, spec.ray_service.get("upgradeStrategy"), running)
            desired = await rendering.desired(
                memory.desired, target, spec, body, running, self.cache, self.rollouts.parser, restart.value
            )
            if isinstance(desired, Outcome):
                return live, clash, decision, target, out.then(desired)
            memory.desired = desired
            if live is not None and live.raw is not None:  # seen before anything was desired
                live = live_of(live.raw, desired)
                self.cache.put_rayservice((namespace, rs_name), live)
            step = "apply"
            applied = await self.writer.apply(key, body["metadata"]["uid"], desired, live, may_write)
            live, clash, out = applied.live, applied.clash, out.then(applied.found)
            if decision is not None and applied.upgrade is not None:
                decision = with_upgrade(decision, applied.upgrade)
            if restart.refused is not None and out.applied is not None and out.applied.status:
                out = out.then(Outcome(applied=restart.refused))
        except Exception as exc:
            out = out.then(self._unexpected(key, step, exc))
        return live, clash, decision, target, out

    async def _suspended(self, key: Key, body: dict[str, Any], spec: ServeGraphSpec, memory: Memory) -> None:
        """spec.suspend (operator/rollout/suspension.py): delete the RayService, keep the rest, download nothing."""
        suspension.hold_polls(memory.fetch, spec.source, self.clock())
        memory.desired = None  # rendered again from the kept graph on resume
        rs_name = rayservice_name(spec.ray_service.get("name") or body["metadata"]["name"])
        live = clash = None
        deleted = False
        out = Outcome()
        try:
            live, clash, out = await self.writer.owned_live(key, body, rs_name)
            if clash is None and not out.retry and self._current(key, body):
                deleted, out = await suspension.remove(self.api, self.cache, key, rs_name, body, live)
                self.metrics.writes.labels("rayservice").inc(deleted)
        except Exception as exc:
            out = out.then(self._unexpected(key, "apply", exc))
        still = frozenset(t for t, src in memory.computed_for.items() if src == spec.source)
        now = self.rollouts.clock()
        observed = suspension.report(out, body.get("status") or {}, rs_name, live, deleted, clash, still, now)
        out = observed.outcome
        memory.computed_for.update({c.type: spec.source for c in (out.applied, out.progressing) if c is not None})
        await self._write_status(key, body, memory, observed)
        if out.retry:
            raise RetryLater

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

    def _unexpected(self, key: Key, step: str, exc: Exception) -> Outcome:
        """A step failed in a way nobody foresaw: log it whole for the administrator, count it,
        and say in the step's condition which exception it was (its text could carry a secret)."""
        log.error("[%s/%s] unexpected %s while %s", *key, type(exc).__name__, STEPS[step][1], exc_info=exc)
        self.metrics.internal_error(step, exc)
        kind = STEPS[step][0]
        if kind is None:
            return Outcome(retry=True)
        cond = Condition(kind, False, "InternalError", _internal(exc, step))
        return Outcome(fetched=cond, retry=True) if kind == ConditionType.FETCHED else Outcome(applied=cond, retry=True)

    async def _event(self, body: dict[str, Any], event: Event, now: str) -> None:
        try:
            await self.api.post_event(body, event.type, event.reason, event.message, now)
            self.metrics.writes.labels("event").inc()
        except KubeError as exc:
            meta = body["metadata"]
            log.warning("[%s/%s] cannot post event %s: %s", meta["namespace"], meta["name"], event.reason, exc)


def _internal(exc: Exception, step: str) -> str:
    return f"unexpected {type(exc).__name__} while {STEPS[step][1]}; the operator's log has the details"
