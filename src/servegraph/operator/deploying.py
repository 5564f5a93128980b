"""Ownership → rollout → render → apply: a valid graph to a running RayService, and suspending one
(KubeRay's own spec.suspend rendered where the installed KubeRay has it; else the RayService deleted).

The reconcile (reconcile.py) downloads, then hands the ServeGraph here; each step returns
its findings as an `Outcome`, chained in order, the first asking to retry ending the chain.
What the rollout and render steps return is recorded in the ServeGraph's `Memory` here,
and nowhere else but the reconcile.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from servegraph.names import ConditionType, Key
from servegraph.operator.apply import removal, rendering
from servegraph.operator.apply.drift import live_of
from servegraph.operator.apply.expose import RouteWriter
from servegraph.operator.apply.writer import RayServiceWriter
from servegraph.operator.cache import Memory, WatchCache
from servegraph.operator.conditions import Condition
from servegraph.operator.kuberay import Live
from servegraph.operator.metrics import Metrics
from servegraph.operator.protocols import ApiServer, RouteApi
from servegraph.operator.rollout import restart as restarts
from servegraph.operator.rollout import suspension
from servegraph.operator.rollout.decide import Decision
from servegraph.operator.rollout.step import Rollouts, with_upgrade
from servegraph.operator.spec import ServeGraphSpec
from servegraph.operator.unexpected import unexpected
from servegraph.operator.values import GoodGraph, Layout, Observed, Outcome
from servegraph.render.httproute import routed
from servegraph.render.kuberay_features import KubeRayFeatures
from servegraph.render.rayservice import rayservice_name


@dataclass(frozen=True)
class Deployed:
    """What ownership → rollout → render → apply left: the live RayService, why it is not ours
    to write (None when it is), the rollout decision, the graph it runs, and what the steps found."""

    live: Live | None
    clash: str | None
    decision: Decision | None
    target: GoodGraph | None
    found: Outcome
    layout: Layout | None = None
    """What the Serve config runs, once rendered and applied (status.layout records it)."""


class Deployer:
    def __init__(
        self,
        api: ApiServer,
        cache: WatchCache,
        metrics: Metrics,
        rollouts: Rollouts,
        monotonic: Callable[[], float] = time.monotonic,
        kuberay: KubeRayFeatures | None = None,
        routes: RouteApi | None = None,
    ) -> None:
        self.api = api
        self.kuberay = kuberay
        """What the installed KubeRay's RayService CRD offers, read at start (None: not known)."""
        self.cache = cache
        self.metrics = metrics
        self.rollouts = rollouts
        self.writer = RayServiceWriter(api, cache, metrics)
        self.routes = RouteWriter(routes, metrics)
        """The HTTPRoutes of spec.expose (apply/expose.py)."""
        self.monotonic = monotonic

    async def deploy(
        self,
        key: Key,
        body: dict[str, Any],
        spec: ServeGraphSpec,
        memory: Memory,
        rs_name: str,
        found: Outcome,
        may_write: Callable[[], bool],
    ) -> Deployed:
        """Ownership → rollout → render → apply, each step's Outcome chained onto `found` (what
        the download found), stopping at the first step that asks to retry. A download that asks
        to retry stops nothing: the rollout goes on with the graph it has (a canary's checks and
        deadlines run through a registry outage; a new leader adopts the kept graph). Records in `memory` what
        the rollout and render steps return. `may_write` is asked before every write (the
        ServeGraph may have gone, been replaced or moved to another shard meanwhile)."""
        namespace = key[0]
        decision: Decision | None = None
        target: GoodGraph | None = None
        layout: Layout | None = None
        step = "ownership"
        out = found
        live: Live | None = None
        clash: str | None = None
        try:
            owned = await self.writer.owned_live(key, body, rs_name)
            live, clash, out = owned.live, owned.clash, out.then(owned.found)
            deleting = live is not None and live.deleting  # after a suspend: created again once gone
            if deleting:
                live = None
                waiting = f"RayService {rs_name} is deleting"
                out = out.then(Outcome(applied=Condition(ConditionType.APPLIED, None, "WaitingForDeletion", waiting)))
            if clash is not None or owned.found.retry:
                return Deployed(live, clash, decision, target, out)
            step = "rollout"
            plan = await self.rollouts.plan(body, memory, spec, live, may_write, rs_name)
            target, decision, out, layout = plan.target, plan.decision, out.then(plan.found), plan.layout
            memory.target, memory.stored = target, plan.stored
            stored = {h["digest"] for h in decision.history if h.get("rollbackAvailable")}
            if memory.good is not None and memory.good.digest in stored:
                memory.unkept = False  # in the store now: not written again
            if target is None or plan.found.retry or deleting:
                return Deployed(live, clash, decision, target, out)
            step = "render"
            running = live.cluster if live is not None else None
            annotations = body["metadata"].get("annotations") or {}
            restart = restarts.decide(annotations, spec.ray_service.strategy, running)
            desired = await rendering.desired(
                memory.desired, layout or target, spec, body, running, self.cache, self.rollouts.parser, restart.value
            )
            if isinstance(desired, Outcome):
                return Deployed(live, clash, decision, target, out.then(desired))
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
            ran = out.applied is not None and out.applied.status  # the RayService as rendered
            if not out.retry:
                step = "expose"
                out = out.then(await self._expose(key, body, spec, target, may_write))
            if ran:
                return Deployed(live, clash, decision, target, out, layout)  # what now runs
        except Exception as exc:
            out = out.then(unexpected(key, step, exc, self.metrics))
        return Deployed(live, clash, decision, target, out)

    async def _expose(
        self, key: Key, body: dict[str, Any], spec: ServeGraphSpec, target: GoodGraph, may_write: Callable[[], bool]
    ) -> Outcome:
        """The ServeGraph's HTTPRoute (spec.expose) for the graph it runs, its applications' prefixes."""
        prefixes: dict[str, str] = {}
        if spec.expose is not None:
            prefixes = routed(await rendering.parsed(target, self.cache, self.rollouts.parser, key[0]))
        return await self.routes.reconcile(key, body, spec, prefixes, may_write)

    async def suspend(
        self, key: Key, body: dict[str, Any], spec: ServeGraphSpec, memory: Memory, may_write: Callable[[], bool]
    ) -> Observed:
        """spec.suspend (rollout/suspension.py decides): KubeRay's own spec.suspend rendered onto the
        RayService where the installed KubeRay has it, else the RayService deleted (apply/removal.py);
        the rest kept, nothing downloaded; what the status says."""
        memory.fetch = suspension.hold_polls(memory.fetch, spec.source, self.monotonic())
        in_kuberay = self.kuberay is not None and self.kuberay.suspend
        if not in_kuberay:
            memory.desired = None  # rendered again from the kept graph on resume
        rs_name = rayservice_name(spec.ray_service.name or body["metadata"]["name"])
        live = clash = None
        acted = False
        out = Outcome()
        try:
            owned = await self.writer.owned_live(key, body, rs_name)
            live, clash, out = owned.live, owned.clash, owned.found
            if clash is None and not out.retry and in_kuberay:
                live, clash, acted, found = await self._suspend_in_kuberay(key, body, spec, memory, live, may_write)
                out = out.then(found)
            elif clash is None and not out.retry and may_write():
                removed = await removal.remove(self.api, self.cache, key, rs_name, body, live)
                acted, out = removed.deleted, out.then(removed.found)
                self.metrics.writes.labels("rayservice").inc(acted)
        except Exception as exc:
            out = out.then(unexpected(key, "apply", exc, self.metrics))
        still = frozenset(t for t, src in memory.computed_for.items() if src == spec.source)
        now = self.rollouts.wall()
        status = body.get("status") or {}
        observed = suspension.report(out, status, rs_name, live, acted, clash, still, now, in_kuberay)
        out = observed.outcome
        memory.computed_for.update({c.type: spec.source for c in (out.applied, out.progressing) if c is not None})
        return observed

    async def _suspend_in_kuberay(
        self,
        key: Key,
        body: dict[str, Any],
        spec: ServeGraphSpec,
        memory: Memory,
        live: Live | None,
        may_write: Callable[[], bool],
    ) -> tuple[Live | None, str | None, bool, Outcome]:
        """The RayService rendered from the version it keeps with KubeRay's `suspend: true`, applied
        like any render (nothing written when it says so already); none is created. Returns the
        live record, why it is not ours (or None), whether it was written, and what was found."""
        if live is None or live.deleting:
            return live, None, False, Outcome()  # nothing runs; a resume creates it
        meta = body["metadata"]
        digest = ((body.get("status") or {}).get("rollout") or {}).get("digest")
        target, found = await self.rollouts.graph(memory, meta["namespace"], meta["name"], digest)
        if target is None:
            return live, None, False, found
        restart = restarts.decide(meta.get("annotations") or {}, spec.ray_service.strategy, live.cluster)
        desired = await rendering.desired(
            memory.desired,
            target,
            spec,
            body,
            live.cluster,
            self.cache,
            self.rollouts.parser,
            restart.value,
            suspend=True,
        )
        if isinstance(desired, Outcome):
            return live, None, False, found.then(desired)
        memory.desired = desired
        if live.raw is not None:  # seen before anything was desired
            live = live_of(live.raw, desired)
            self.cache.put_rayservice((key[0], str(desired.frame["metadata"]["name"])), live)
        applied = await self.writer.apply(key, meta["uid"], desired, live, may_write)
        wrote = any(e.reason == "Applied" for e in applied.found.events)
        said = replace(applied.found, events=tuple(e for e in applied.found.events if e.reason != "Applied"))
        return applied.live, applied.clash, wrote, found.then(said)
