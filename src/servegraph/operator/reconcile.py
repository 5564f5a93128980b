"""The reconcile: fetch → graph → rollout → render → apply → status, for one ServeGraph.

Level-triggered: the desired RayService is a function of the spec, the graph the
rollout runs (the last valid download, or a kept one: rollback, pin) and nothing
else, so any trigger may run it any number of times. A failed download or an
invalid graph changes conditions, never the running RayService. In steady state it
reads nothing but the RayService and writes nothing at all.

The reconciler composes the edges it is given (`edges`): an `ApiServer` (the
Kubernetes client in production, an in-memory one in unit tests), a `Fetcher` (the
registry client), a `Parser`, the `WatchCache` and the work queue. Which version to
run is `progress.Rollouts`' answer; what the status says is decided by
`status.report`, a pure function.

What a tenant cannot make it do: write a RayService another ServeGraph or a person
owns (`drift.conflict`), write anything for a ServeGraph deleted or replaced while
its graph downloaded (re-checked before every write, and the status write carries
a uid precondition), or hold more than its namespace's share of the downloads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from servegraph.kube import KubeError
from servegraph.names import GROUP, KIND, REFRESH_ANNOTATION, SPEC_HASH_ANNOTATION
from servegraph.operator import conditions
from servegraph.operator.cache import Key, Memory, WatchCache
from servegraph.operator.conditions import Condition
from servegraph.operator.download import Downloader
from servegraph.operator.drift import Desired, Live, conflict, live_of, live_record
from servegraph.operator.edges import ApiServer, Fetcher, Parser
from servegraph.operator.metrics import Metrics
from servegraph.operator.parsing import parse_here
from servegraph.operator.progress import Rollouts
from servegraph.operator.queue import WorkQueue
from servegraph.operator.rollout import Decision
from servegraph.operator.secrets import SecretCache
from servegraph.operator.slots import NamespaceSlots
from servegraph.operator.spec import ServeGraphSpec, Source, SpecError, owner_reference, parse_spec
from servegraph.operator.status import Event, GoodGraph, Observed, Outcome, report
from servegraph.render import render_rayservice
from servegraph.render.rayservice import rayservice_name
from servegraph.render.upgrade import predict
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
        secret_ttl_s: float = 10.0,
    ) -> None:
        self.api = api
        self.metrics = metrics
        self.queue = queue
        self.cache = cache or WatchCache()
        self.secrets = SecretCache(api.read_secret_data, ttl_s=secret_ttl_s)
        self.slots = NamespaceSlots(fetches_per_namespace, queue.add)
        self.downloader = Downloader(
            fetcher, parser, self.secrets, api, limits or Limits(), self.cache, queue.min_retry_delay_s
        )
        self.rollouts = Rollouts(api, parser, metrics)
        metrics.watch_conditions(self.cache.condition_pairs)

    # -- triggers: each only records what changed and queues the key -------------

    def servegraph_changed(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if deleted:
            self.cache.forget_servegraph(key)
            self.queue.discard(key)
            self.slots.forget(key)
            self.metrics.forget(key)
            return
        self.cache.put_servegraph(body)
        self.queue.add(key)

    def rayservice_changed(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        """A labelled RayService changed or vanished: repair drift, mirror status."""
        meta = body.get("metadata") or {}
        namespace = meta.get("namespace", "")
        owners = [
            (namespace, o.get("name", ""))
            for o in meta.get("ownerReferences") or ()
            if o.get("kind") == KIND and o.get("apiVersion", "").startswith(f"{GROUP}/")
        ]
        memory = self.cache.peek_memory(owners[0]) if owners else None
        desired = memory.desired if memory is not None else None
        self.cache.put_rayservice((namespace, meta.get("name", "")), None if deleted else live_of(body, desired))
        for key in owners:
            if self.cache.body(key) is not None:
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
        finally:
            self.metrics.observe_reconcile(key, result, time.monotonic() - start)

    def _current(self, key: Key, body: Mapping[str, Any]) -> bool:
        """Whether the ServeGraph read at the start is still there, the same object: checked
        before every write, as a download or an API call may have let it be deleted or replaced."""
        now = self.cache.body(key)
        return now is not None and now["metadata"].get("uid") == body["metadata"].get("uid")

    async def _reconcile(self, key: Key, body: dict[str, Any]) -> float | None:
        namespace, _ = key
        memory = self.cache.memory(key)
        out = Outcome()
        try:
            spec = parse_spec(body.get("spec") or {}, namespace)
        except SpecError as exc:
            out.fetched = Condition("Fetched", False, "InvalidSpec", str(exc))
            await self._write_status(
                key, body, memory, Observed(out, None, None, None, None, still_current=frozenset())
            )
            return None

        refresh = (body["metadata"].get("annotations") or {}).get(REFRESH_ANNOTATION)
        if self._needs_fetch(memory, spec.source, refresh, time.monotonic()):
            if self.slots.acquire(key):
                try:
                    await self.downloader.run(key, memory, spec.source, refresh, out)
                finally:
                    self.slots.release(key)
            # else: parked; the namespace's next freed slot queues it again
            if not self._current(key, body):
                return None  # deleted or replaced while downloading: write nothing for it

        live: Live | None = None
        rs_name = clash = None
        decision: Decision | None = None
        target: GoodGraph | None = None
        if memory.good is not None or (body.get("status") or {}).get("rollout"):
            rs_name = rayservice_name(spec.ray_service.get("name") or body["metadata"]["name"])
            live, clash = await self._owned_live(key, body, rs_name, out)
            if clash is None and not out.retry:
                target, decision = await self.rollouts.plan(
                    body, memory, spec.rollout, spec.source.url, live, out, may_write=lambda: self._current(key, body)
                )
            if target is not None and not out.retry:
                desired = await self._desired(memory, target, spec, body, live)
                if live is not None and live.raw is not None:  # seen before anything was desired
                    live = live_of(live.raw, desired)
                    self.cache.put_rayservice((namespace, rs_name), live)
                live = await self._apply_if_needed(key, body, desired, live, out, decision)
        if memory.good is None and target is None and out.applied is None:
            out.applied = Condition("Applied", False, "NoValidGraph", "no valid graph has been downloaded yet")
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
            delays.append(max(0.0, memory.fetch.poll_due - time.monotonic()))
        known = [d for d in delays if d is not None]
        return min(known) if known else None

    async def _owned_live(
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
            live = await self._get_live(namespace, rs_name, out)
            if live is not None:
                clash = conflict(live, namespace, rs_name, body["metadata"]["uid"])
        if clash is not None:
            out.applied = Condition("Applied", False, "Conflict", clash)
            out.retry = True
            return None, clash
        return live, None

    async def _desired(
        self, memory: Memory, good: GoodGraph, spec: ServeGraphSpec, body: Mapping[str, Any], live: Live | None
    ) -> Desired:
        """The rendered RayService, re-rendered only when the graph, the spec or the running
        cluster's worker groups changed (status updates and KubeRay's writes trigger many
        reconciles that change none of them). Rendered in a thread: a 10,000-node graph
        takes a tenth of a second of CPU."""
        meta = body["metadata"]
        previous = live.cluster if live is not None else None
        groups = tuple(g.get("groupName") for g in (previous or {}).get("workerGroupSpecs") or ())
        render_key = (good.digest, meta.get("uid"), meta.get("generation"), groups)
        if memory.desired is None or memory.desired.render_key != render_key:
            options = replace(
                spec.rayservice_options(meta["name"], meta["namespace"], owner_reference(body)),
                previous_cluster=previous,
            )
            manifest = await asyncio.to_thread(render_rayservice, good.graph, options)
            match_key = (manifest["metadata"]["annotations"][SPEC_HASH_ANNOTATION], meta.get("uid"))
            memory.desired = Desired(manifest, render_key, match_key)
        return memory.desired

    def _needs_fetch(self, memory: Memory, source: Source, refresh: str | None, now: float) -> bool:
        """New inputs fetch at once; a failure waits for its retry; otherwise only a poll fetches."""
        state = memory.fetch
        if state.force or state.source != source or state.refresh != refresh:
            return True
        if state.retry_at:
            return now >= state.retry_at
        return source.poll_interval_s is not None and now >= state.poll_due

    async def _get_live(self, namespace: str, name: str, out: Outcome) -> Live | None:
        cached = self.cache.rayservice((namespace, name))
        if cached is None or isinstance(cached, Live):
            return cached
        try:  # not delivered by the watch yet (start-up): read it once
            body = await self.api.get_rayservice(namespace, name)
        except KubeError as exc:
            out.applied = Condition("Applied", False, "ReadFailed", str(exc))
            out.retry = True
            return None
        live = None if body is None else live_of(body, None)
        self.cache.put_rayservice((namespace, name), live)
        return live

    async def _apply_if_needed(
        self,
        key: Key,
        body: dict[str, Any],
        desired: Desired,
        live: Live | None,
        out: Outcome,
        decision: Decision | None,
    ) -> Live | None:
        meta = desired.manifest["metadata"]
        name, where = meta["name"], (meta["namespace"], meta["name"])
        if live is not None and live.matched is not None and live.matched == desired.match_key:
            out.applied = Condition("Applied", True, "UpToDate", f"RayService {name} matches the graph and spec")
            return live
        old = None if live is None else {"spec": {"rayClusterConfig": live.cluster, "serveConfigV2": live.serve_config}}
        prediction = await asyncio.to_thread(predict, old, desired.manifest)  # reads both Serve configs
        if decision is not None and decision.rollout is not None and "upgrade" not in decision.rollout:
            decision.rollout["upgrade"] = prediction.kind
            if decision.history:
                decision.history[0].setdefault("upgrade", prediction.kind)
        if prediction.new_cluster:
            out.events.append(Event("Normal", "NewClusterUpgrade", f"RayService {name}: {prediction.summary()}"))
        if not self._current(key, body):
            return live
        try:
            # Forced only over a RayService known to be ours (drift repair); one believed absent
            # is created without force, so one made meanwhile by someone else answers 409.
            applied = await self.api.apply_rayservice(desired.manifest, force=live is not None)
        except KubeError as exc:
            reason = "Conflict" if exc.status == 409 else "ApplyFailed"
            if exc.status == 409:
                self.cache.forget_rayservice(where)  # read it next time, and see whose it is
            out.applied = Condition("Applied", False, reason, str(exc))
            out.retry = True
            return live
        self.metrics.writes.labels("rayservice").inc()
        record = live_record(applied, desired.match_key)
        self.cache.put_rayservice(where, record)
        verb = "created" if live is None else "updated"
        log.info("[%s/%s] %s RayService %s", key[0], key[1], verb, name)
        out.events.append(Event("Normal", "Applied", f"{verb} RayService {name}"))
        out.applied = Condition("Applied", True, "UpToDate", f"RayService {name} matches the graph and spec")
        return record

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
                await self.api.patch_servegraph_status(ns, name, meta["uid"], result.status)
            except KubeError as exc:
                if exc.status == 404 or exc.reason == "Replaced":
                    return  # deleted, or deleted and created again, meanwhile
                log.warning("[%s/%s] status update failed: %s", ns, name, exc)
                raise RetryLater from None
            self.metrics.writes.labels("status").inc()
            body["status"] = result.status
            for c in result.transitions:
                log.info("[%s/%s] %s=%s %s: %s", ns, name, c["type"], c["status"], c["reason"], c["message"])
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
