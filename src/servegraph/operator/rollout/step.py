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
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from servegraph.graph import GraphError
from servegraph.kube import KubeError
from servegraph.names import ConditionType
from servegraph.operator.apply.drift import Live
from servegraph.operator.cache import Memory, WatchCache
from servegraph.operator.protocols import ConfigMapApi, Parser
from servegraph.operator.rollout import store, suspension
from servegraph.operator.rollout.blockers import blocking_problem
from servegraph.operator.rollout.decide import (
    FAILED,
    PROGRESSING,
    ROLLED_BACK,
    SERVING,
    SUPERSEDED,
    Candidate,
    Decision,
    Health,
    RolloutSpec,
    decide,
    kept_digests,
)
from servegraph.operator.run.metrics import Metrics
from servegraph.operator.spec import owner_reference
from servegraph.operator.status.conditions import Condition
from servegraph.operator.status.report import Event, GoodGraph, Outcome

log = logging.getLogger("servegraph.operator")


METRIC_OUTCOMES = {SERVING: "succeeded", FAILED: "failed", ROLLED_BACK: "rolled_back", SUPERSEDED: "superseded"}


class Rollouts:
    def __init__(
        self,
        api: ConfigMapApi,
        parser: Parser,
        graphs: WatchCache,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.parser = parser
        """Kept graphs are parsed as downloads are: off the event loop, with the graph limits."""
        self.graphs = graphs
        """The recently parsed graphs: a kept graph parsed here is not parsed again to render."""
        self.metrics = metrics
        self.clock = clock
        """Wall-clock seconds: rollout times are written to the status (RFC 3339)."""

    async def plan(
        self,
        body: Mapping[str, Any],
        memory: Memory,
        rollout_spec: RolloutSpec,
        source_url: str,
        live: Live | None,
        may_write: Callable[[], bool] = lambda: True,
    ) -> tuple[GoodGraph | None, Decision, store.Stored | None, Outcome]:
        """(the graph to render and apply, the decision to report, the store as now written,
        what the step found). `may_write` is asked before the store is written (the ServeGraph
        may have gone meanwhile). Reads `memory`, never writes it: what the reconcile remembers
        is its to record."""
        meta = body["metadata"]
        ns, name = meta["namespace"], meta["name"]
        status = suspension.resume(body.get("status") or {}, self.clock())  # a rollout's clock runs again
        candidate = None
        if memory.good is not None:
            candidate = Candidate(memory.good.digest, memory.good.version, source_url)
        current, found = await self._graph(memory, ns, name, (status.get("rollout") or {}).get("digest"))
        health = None
        if live is not None:
            expected = current.applications if current is not None else ()
            blocker = blocking_problem(live.applications, live.pending, expected)
            health = Health(live.settled, live.applications, live.upgrade, expected, blocker)
        history = status.get("history") or []
        kept = [h["digest"] for h in history if h.get("rollbackAvailable")]
        decision = decide(rollout_spec, candidate, status, kept, health, self.clock())
        found = found.then(Outcome(events=tuple(Event(*e) for e in decision.events), progressing=decision.progressing))
        if decision.outcome is not None:
            log.info("[%s/%s] rollout of %s: %s", ns, name, (decision.rollout or {}).get("version"), decision.outcome)
        self._count(ns, name, decision, current, memory)
        started = decision.history and "rollbackAvailable" not in decision.history[0]
        stored = memory.stored
        if started:
            decision, stored, keeping = await self._keep(body, memory, decision, may_write)
            found = found.then(keeping)
        target, loading = await self._graph(memory, ns, name, decision.target)
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
        return target, decision, stored, found

    async def _graph(self, memory: Memory, ns: str, name: str, digest: str | None) -> tuple[GoodGraph | None, Outcome]:
        if digest is None:
            return None, Outcome()
        for known in (memory.good, memory.target):
            if known is not None and known.digest == digest:
                return known, Outcome()
        try:
            kept = await store.load(self.api, ns, name)
        except KubeError as exc:
            failed = Condition(ConditionType.APPLIED, False, "ReadFailed", f"cannot read the kept graphs: {exc}")
            return None, Outcome(applied=failed, retry=True)
        data = kept.get(digest)
        if data is None:
            return None, Outcome()
        try:
            graph = self.graphs.graph(digest) or await self.parser(data, store.BUDGET)
        except GraphError:  # kept before a stricter validator: not runnable any more
            return None, Outcome()
        self.graphs.share_graph(digest, graph)
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
        self, body: Mapping[str, Any], memory: Memory, decision: Decision, may_write: Callable[[], bool]
    ) -> tuple[Decision, store.Stored | None, Outcome]:
        """Store the new version's graph (and keep the others of the history): the decision
        with each history entry marked kept or not, the store as now written, and a Warning
        when the store failed (forgotten then: read before its next write)."""
        meta = body["metadata"]
        new = {}
        if memory.good is not None and memory.unkept:
            new[memory.good.digest] = memory.good.data()
        ready = [h["digest"] for h in decision.history if h.get("readyAt")]
        order = [*ready[:1], *kept_digests(decision.history)]
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
