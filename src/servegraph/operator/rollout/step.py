"""The reconcile's rollout step: decide (rollout.decide), keep graphs (store), find the target.

Between the download and the render: which version to run is no longer simply "the
last valid download" — a rollout in progress, a rollback or a pin decide it. This
module gathers what `rollout.decide` needs, keeps the graphs a later rollback may
need, and returns the graph to render. Its I/O is the store's ConfigMap, read only
when a version not in memory must run (after a restart, for a rollback or a pin).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from servegraph.dag.model import Graph
from servegraph.evidence import Reader
from servegraph.graph import GraphError
from servegraph.kube import KubeError
from servegraph.names import ConditionType
from servegraph.operator.cache import Memory, WatchCache
from servegraph.operator.conditions import Condition
from servegraph.operator.kuberay import Live, blocking_problem
from servegraph.operator.metrics import Metrics
from servegraph.operator.protocols import ConfigMapApi, Parser
from servegraph.operator.rollout import canaries, canary, clusters, store, suspension
from servegraph.operator.rollout.canaries import Versions
from servegraph.operator.rollout.canary import Gate
from servegraph.operator.rollout.decide import (
    FAILED,
    PROGRESSING,
    ROLLED_BACK,
    SERVING,
    SUPERSEDED,
    Candidate,
    Decision,
    Health,
    decide,
    kept_digests,
)
from servegraph.operator.spec import RolloutSpec, ServeGraphSpec, owner_reference
from servegraph.operator.values import Event, GoodGraph, Layout, Outcome, Stored

log = logging.getLogger("servegraph.operator")


METRIC_OUTCOMES = {SERVING: "succeeded", FAILED: "failed", ROLLED_BACK: "rolled_back", SUPERSEDED: "superseded"}


@dataclass(frozen=True)
class Plan:
    """What the rollout step decided: the graph to render and apply (None: nothing to run),
    the decision to report, the rollback store as now written, and what the step found."""

    target: GoodGraph | None
    decision: Decision
    stored: Stored | None
    found: Outcome
    layout: Layout | None = None
    """What the Serve config runs (the target alone, or beside the base and a canary): None
    with no target."""


class Rollouts:
    def __init__(
        self,
        api: ConfigMapApi,
        parser: Parser,
        graphs: WatchCache,
        metrics: Metrics | None = None,
        wall: Callable[[], float] = time.time,
        evidence: Reader | None = None,
    ) -> None:
        self.api = api
        self.evidence = evidence
        """Reads a canary's evidence (Prometheus, or the routers' own counters); None: none read."""
        self.parser = parser
        """Kept graphs are parsed as downloads are: off the event loop, with the graph limits."""
        self.graphs = graphs
        """The recently parsed graphs: a kept graph parsed here is not parsed again to render."""
        self.metrics = metrics
        self.wall = wall
        """Epoch seconds: rollout times are written to the status (RFC 3339) and read back by
        any later leader, so they are wall-clock times, not this process's monotonic clock."""

    async def plan(
        self,
        body: Mapping[str, Any],
        memory: Memory,
        spec: ServeGraphSpec,
        live: Live | None,
        may_write: Callable[[], bool] = lambda: True,
        rs_name: str = "",
    ) -> Plan:
        """Which graph runs now, and how (a canary beside the live version: rollout/canaries.py).
        `may_write` is asked before the store is written (the ServeGraph may have gone meanwhile).
        Reads `memory`, never writes it: what the reconcile remembers is its to record."""
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        rollout_spec, now = spec.rollout, self.wall()
        status = suspension.resume(body.get("status") or {}, now)  # a rollout's clock runs again
        candidate = None
        if memory.good is not None:
            candidate = Candidate(memory.good.digest, memory.good.version, spec.source.url)
        rollout = status.get("rollout") or {}
        read: dict[str, bytes] = {}
        current, found = await self._graph(memory, ns, name, rollout.get("digest"), read)
        health = None
        if live is not None:
            expected = current.applications if current is not None else ()
            blocker = blocking_problem(live.applications, live.pending, expected)
            health = Health(live.settled, live.applications, live.upgrade, expected, blocker)
        layout_status = status.get("layout") or {}
        base, loading = await self._graph(memory, ns, name, layout_status.get("base"), read)
        serving, also = await self._graph(memory, ns, name, layout_status.get("live"), read)
        found = found.then(loading).then(also)
        versions = Versions(base, serving or base)
        step, gate = await self._canary(body, rollout_spec, rollout, current, versions, live, rs_name, now)
        history = status.get("history") or []
        kept = [h["digest"] for h in history if h.get("rollbackAvailable")]
        decision = decide(rollout_spec, candidate, status, kept, health, now, gate)
        decision = self._canary_after(decision, rollout, step, versions)
        if live is not None:  # the Ray cluster KubeRay starts for a version, on its history entry
            decision = clusters.note(decision, live.upgrade, live.active_cluster, live.settled, now)
        found = found.then(Outcome(events=tuple(Event(*e) for e in decision.events), progressing=decision.progressing))
        if decision.outcome is not None:
            log.info("[%s/%s] rollout of %s: %s", ns, name, (decision.rollout or {}).get("version"), decision.outcome)
        self._count(ns, name, decision, current, memory)
        started = decision.history and "rollbackAvailable" not in decision.history[0]
        stored = memory.stored
        if started:
            keep = [g.digest for g in (base, serving) if g is not None]
            decision, stored, keeping = await self._keep(body, memory, decision, may_write, keep)
            found = found.then(keeping)
            read.clear()  # the store may have changed
        target, loading = await self._graph(memory, ns, name, decision.target, read)
        found = found.then(loading)
        if decision.target is not None and target is None and not found.retry:
            found = found.then(
                Outcome(
                    applied=Condition(
                        ConditionType.APPLIED,
                        False,
                        "GraphUnavailable",
                        f"the graph {decision.target[:12]} to run is neither downloaded nor kept; "
                        "the RayService stays as it is",
                    )
                )
            )
        layout = None
        if target is not None:
            count = len(decision.events)
            decision = await self._start_canary(spec, decision, target, versions, ns, now)
            found = found.then(Outcome(events=tuple(Event(*e) for e in decision.events[count:])))
            found = found.then(Outcome(progressing=canary.condition(decision.rollout)))
            retiring, loading = await self._graph(memory, ns, name, (decision.rollout or {}).get("retiring"), read)
            found = found.then(loading)
            layout = canaries.target_layout(spec, decision.rollout, target, versions, retiring, meta.get("uid", ""))
        return Plan(target, decision, stored, found, layout)

    async def _canary(
        self,
        body: Mapping[str, Any],
        spec: RolloutSpec,
        rollout: Mapping[str, Any],
        current: GoodGraph | None,
        versions: Versions,
        live: Live | None,
        rs_name: str,
        now: float,
    ) -> tuple[canary.Step | None, Gate | None]:
        """A running canary advanced from what is observed now: its next step, and what it says
        to its rollout (held open, or failed: aborted)."""
        state = rollout.get("canary") or {}
        if (
            spec.canary is None
            or rollout.get("phase") != PROGRESSING
            or state.get("phase") not in canary.CANARY_RUNS
            or current is None
            or versions.base is None
            or versions.live is None
        ):
            return None, None
        meta = body["metadata"]
        ns, tenant = meta["namespace"], meta["namespace"]
        base, live_graph, new = [await self._model(g, tenant) for g in (versions.base, versions.live, current)]
        beside = None if versions.live.digest == versions.base.digest else live_graph
        running = canaries.copies(canaries.laid_out(base, beside, new, None), live)
        read_evidence, unread = None, ""
        if canary.check_due(spec.canary, state, now):
            request = canaries.request(ns, rs_name, state, versions.live, new, current.digest, meta.get("uid", ""), now)
            read_evidence, unread = await canaries.evidence(self.evidence, request)
        verb, value = canaries.action(meta.get("annotations") or {}, state)
        facts = canary.Facts(running[0], running[1], read_evidence, verb, value)
        step = canary.advance(spec.canary, state, facts, now, spec.progress_deadline_s)
        if unread and step.phase in canary.CANARY_RUNS:
            step.state["message"] = f"evidence unavailable: {unread}"[:2048]
        if step.phase == canary.ABORTED:
            return step, Gate(fail=("CanaryAborted", str(step.state["message"])))
        return step, Gate(hold=step.phase in canary.CANARY_RUNS)

    def _canary_after(
        self, decision: Decision, rollout: Mapping[str, Any], step: canary.Step | None, versions: Versions
    ) -> Decision:
        """The running canary's next state into the decision: where it went on, or how it ended."""
        d = decision
        if step is None or d.rollout is None:
            return d
        if d.rollout.get("digest") == rollout.get("digest"):
            d.rollout["canary"] = step.state
            if step.phase == canary.PROMOTED and versions.live is not None:
                d.rollout["retiring"] = versions.live.digest  # its side applications drain meanwhile
        elif step.phase == canary.ABORTED:  # rolled back to the live version: the copies drain
            d.rollout["retiring"] = rollout.get("digest")
            # the rollback's rollout shows the canary that ended it (phase, message, evidence):
            # what `servegraph status` and `kubectl get sg` read, and what promote/abort refuse on
            d.rollout["canary"] = step.state
        d.events.extend(step.events)
        return d

    async def _start_canary(
        self, spec: ServeGraphSpec, decision: Decision, target: GoodGraph, versions: Versions, tenant: str, now: float
    ) -> Decision:
        """A rollout just started of a version the spec canaries, beside a live one: its canary
        begins (Deploying), or it is refused and rolls out whole (NotCanaried, and why)."""
        d, live, base = decision, versions.live, versions.base
        fresh = d.rollout is not None and "canary" not in d.rollout and d.rollout.get("cause") == "source"
        if spec.rollout.canary is None or not fresh or live is None or base is None or live.digest == target.digest:
            return d
        assert d.rollout is not None
        if d.rollout.get("phase") != PROGRESSING:
            return d
        base_model, live_model, new = [await self._model(g, tenant) for g in (base, live, target)]
        why = await canaries.refusal(spec, base_model, None if live.digest == base.digest else live_model, new)
        step = canary.start(spec.rollout.canary, target.version, live.version, now, why)
        d.rollout["canary"] = step.state
        d.events.extend(step.events)
        return d

    async def _model(self, good: GoodGraph, tenant: str) -> Graph:
        """A kept graph's parsed model: from the recently parsed ones, or parsed again (as a download is)."""
        graph = self.graphs.graph(good.digest)
        if graph is None:
            graph = await self.parser(good.data(), store.BUDGET)
            self.graphs.share_graph(good.digest, graph, tenant)
        return graph

    def next_check(self, spec: ServeGraphSpec, decision: Decision) -> float | None:
        """Seconds until a running canary's next check, however quiet the cluster is: nothing
        else would reconcile it while its weight holds (KubeRay's status does not change)."""
        state = (decision.rollout or {}).get("canary") or {}
        if spec.rollout.canary is None or state.get("phase") not in canary.CANARY_RUNS:
            return None
        return canary.seconds_to_check(spec.rollout.canary, state, self.wall())

    async def graph(self, memory: Memory, ns: str, name: str, digest: str | None) -> tuple[GoodGraph | None, Outcome]:
        """The graph of `digest`, in memory or kept (a suspended RayService renders the version it keeps)."""
        return await self._graph(memory, ns, name, digest)

    async def _graph(
        self, memory: Memory, ns: str, name: str, digest: str | None, read: dict[str, bytes] | None = None
    ) -> tuple[GoodGraph | None, Outcome]:
        """The graph of `digest`: remembered, else from the rollback store. `read` holds the
        store as this plan read it, so a plan reads it at most once (a new leader's first plan
        looks up the rollout's, the layout's and the target's graphs, often all one)."""
        if digest is None:
            return None, Outcome()
        for known in (memory.good, memory.target):
            if known is not None and known.digest == digest:
                return known, Outcome()
        if read is None or not read:
            try:
                kept = await store.load(self.api, ns, name)
            except KubeError as exc:
                failed = Condition(ConditionType.APPLIED, False, "ReadFailed", f"cannot read the kept graphs: {exc}")
                return None, Outcome(applied=failed, retry=True)
            if read is not None:
                read.update(kept or {"": b""})  # an empty store read is still a read
        else:
            kept = read
        data = kept.get(digest)
        if data is None:
            return None, Outcome()
        try:
            graph = self.graphs.graph(digest) or await self.parser(data, store.BUDGET)
        except GraphError:  # kept before a stricter validator: not runnable any more
            return None, Outcome()
        self.graphs.share_graph(digest, graph, ns)
        return GoodGraph.of(graph, digest, data), Outcome()

    def _count(self, ns: str, name: str, decision: Decision, current: GoodGraph | None, memory: Memory) -> None:
        """The rollout's outcome in servegraph_graph_rollouts_total, labelled with the graph's name."""
        if self.metrics is None:
            return
        graph = current or memory.good
        graph_name = graph.name if graph is not None else ""
        if decision.outcome is not None:
            self.metrics.record_rollout((ns, name), METRIC_OUTCOMES[decision.outcome], graph_name)
        if decision.rollout is not None and decision.rollout.get("phase") == PROGRESSING:
            self.metrics.rollout_started((ns, name), graph_name)

    async def _keep(
        self,
        body: Mapping[str, Any],
        memory: Memory,
        decision: Decision,
        may_write: Callable[[], bool],
        layout: Sequence[str] = (),
    ) -> tuple[Decision, Stored | None, Outcome]:
        """Store the new version's graph (and keep the others of the history): the decision
        with each history entry marked kept or not, the store as now written, and a Warning
        when the store failed (forgotten then: read before its next write)."""
        meta = body["metadata"]
        new = {}
        if memory.good is not None and memory.unkept:
            new[memory.good.digest] = memory.good.data()
        ready = [h["digest"] for h in decision.history if h.get("readyAt")]
        # The base and live versions of a layout first: the Serve config is built from them whatever
        # the history holds by now.
        order = [*layout, *ready[:1], *kept_digests(decision.history)]
        exists = any(h.get("rollbackAvailable") for h in decision.history)  # else created without a read
        found = Outcome()
        stored = None
        try:
            kept, stored = await store.keep(
                self.api,
                meta["namespace"],
                meta["name"],
                owner_reference(body),
                order,
                new,
                may_write,
                memory.stored,
                exists,
            )
        except KubeError as exc:
            log.warning("[%s/%s] cannot keep graphs for rollback: %s", meta["namespace"], meta["name"], exc)
            kept = []
            found = Outcome(events=(Event("Warning", "KeepFailed", f"cannot keep graphs for rollback: {exc}"),))
        history = [{**entry, "rollbackAvailable": entry["digest"] in kept} for entry in decision.history]
        return replace(decision, history=history), stored, found


def with_upgrade(decision: Decision, kind: str) -> Decision:
    """The decision with what KubeRay will make of the apply (`render.upgrade.predict`'s kind)
    recorded on a rollout that does not say yet, and on its history entry: a new Decision,
    the one `decide` returned left as it was."""
    if decision.rollout is None or "upgrade" in decision.rollout:
        return decision
    history = [dict(entry) for entry in decision.history]
    if history:
        history[0].setdefault("upgrade", kind)
    return replace(decision, rollout={**decision.rollout, "upgrade": kind}, history=history)
