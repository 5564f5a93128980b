"""Prometheus metrics of the operator, in a registry of its own (with the process's CPU and memory).

Besides the operator's own work (reconciles, downloads, API writes), per ServeGraph
(labels `namespace`, `name`): how long its downloads and reconciles take, which graph
version is live (`servegraph_graph_info`, the join key to the routers' metrics, which
carry `graph` and `graph_version`), and how its rollouts ended. Only the replica that
reconciles reports per-ServeGraph series: standbys have nothing to say.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from servegraph.gcpause import CLOCK, CollectorClock
from servegraph.names import Key
from servegraph.operator.graph_metrics import GraphCounter, GraphHistogram

PER_GRAPH_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Few buckets: these histograms have a series per ServeGraph."""

ROLLOUT_OUTCOMES = ("succeeded", "failed", "rolled_back", "superseded")
"""`outcome` of servegraph_graph_rollouts_total, one per ending of operator/rollout/decide.py."""

_reconciling: contextvars.ContextVar[Key | None] = contextvars.ContextVar("servegraph_reconciling", default=None)
"""The ServeGraph the current task reconciles: registry requests made meanwhile are its downloads."""


class _ConditionCollector(Collector):
    """ServeGraphs by condition, counted at scrape time from the reconciler's view."""

    def __init__(self, snapshot: Callable[[], Iterable[tuple[str, str]]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "servegraph_servegraphs", "ServeGraphs by condition type and status", labels=["condition", "status"]
        )
        counts: dict[tuple[str, str], int] = {}
        for pair in self._snapshot():
            counts[pair] = counts.get(pair, 0) + 1
        for (condition, status), n in sorted(counts.items()):
            family.add_metric([condition, status], n)
        yield family


class _DownloadsCollector(Collector):
    def __init__(self, running: Callable[[], int], waiting: Callable[[], int]) -> None:
        self._running, self._waiting = running, waiting

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily("servegraph_downloads", "Graph downloads by state", labels=["state"])
        family.add_metric(["running"], self._running())
        family.add_metric(["waiting"], self._waiting())
        yield family


class _GraphInfoCollector(Collector):
    """`servegraph_graph_info`: the graph each ServeGraph serves, from the status last written."""

    def __init__(self, live: Mapping[Key, Mapping[str, str]]) -> None:
        self._live = live

    def collect(self) -> Iterable[Metric]:
        family = InfoMetricFamily(
            "servegraph_graph",
            "The graph a ServeGraph has applied: name, version and digest",
            labels=["namespace", "name"],
        )
        for (namespace, name), info in sorted(self._live.items()):
            family.add_metric([namespace, name], dict(info))
        yield family


class _CollectorClockCollector(Collector):
    """The cyclic garbage collector's runs and CPU by generation (`gcpause.CollectorClock`).

    Its cost grows with what the operator holds (each full run walks every live object),
    so this is the figure to watch when ServeGraphs per operator grow, and the one any
    change of the collector's thresholds is judged by."""

    def __init__(self, clock: CollectorClock) -> None:
        self._clock = clock

    def collect(self) -> Iterable[Metric]:
        seconds = CounterMetricFamily(
            "servegraph_gc_cpu_seconds",
            "CPU seconds the Python cyclic garbage collector took, by generation collected",
            labels=["generation"],
        )
        runs = CounterMetricFamily(
            "servegraph_gc_collections",
            "Runs of the Python cyclic garbage collector, by generation",
            labels=["generation"],
        )
        for generation in range(3):
            seconds.add_metric([str(generation)], self._clock.seconds[generation])
            runs.add_metric([str(generation)], self._clock.collections[generation])
        yield seconds
        yield runs


class Metrics:
    def __init__(self, gc_clock: CollectorClock = CLOCK) -> None:
        self.registry = CollectorRegistry()
        self._exists: Callable[[Key], bool] = lambda _key: True
        r = self.registry
        self.reconciles = Counter("servegraph_reconciles_total", "Reconciles by result", ["result"], registry=r)
        self.reconcile_seconds = Histogram(
            "servegraph_reconcile_duration_seconds", "Reconcile duration by result", ["result"], registry=r
        )
        self.fetch_seconds = Histogram(
            "servegraph_fetch_duration_seconds", "Duration of one registry request", ["code"], registry=r
        )
        self.fetch_bytes = Counter("servegraph_fetch_bytes_total", "Graph bytes downloaded", registry=r)
        self.fetch_responses = Counter(
            "servegraph_fetch_responses_total", "Registry responses by HTTP status", ["code"], registry=r
        )
        self.writes = Counter("servegraph_api_writes_total", "Writes to the API server by kind", ["kind"], registry=r)
        self.events = Counter(
            "servegraph_events_total",
            "POST /v1/events answers by HTTP status (503: sent again by the sender, not taken)",
            ["code"],
            registry=r,
        )
        self.internal_errors = Counter(
            "servegraph_internal_errors_total",
            "Exceptions nobody foresaw in a reconcile step, by step and type (a bug: the log has the traceback)",
            ["step", "exception"],
            registry=r,
        )
        self.graph_fetch_seconds = GraphHistogram(
            "servegraph_graph_fetch_duration_seconds",
            "Duration of one registry request for a ServeGraph's graph",
            PER_GRAPH_BUCKETS,
        )
        self.graph_reconcile_seconds = GraphHistogram(
            "servegraph_graph_reconcile_duration_seconds", "Duration of a ServeGraph's reconcile", PER_GRAPH_BUCKETS
        )
        self.rollouts = GraphCounter(
            "servegraph_graph_rollouts", "Rollouts of a new graph digest by how they ended", ["graph", "outcome"]
        )
        for per_graph in (self.graph_fetch_seconds, self.graph_reconcile_seconds, self.rollouts):
            r.register(per_graph)
        self._live: dict[Key, dict[str, str]] = {}
        r.register(_GraphInfoCollector(self._live))
        r.register(_CollectorClockCollector(gc_clock))
        # process_cpu_seconds_total, process_resident_memory_bytes, ...: the operator's cost,
        # which docs/install.md sizes per ServeGraph.
        ProcessCollector(registry=r)

    def reconciling(self, key: Key) -> None:
        """The current task now reconciles `key` (each worker task runs one reconcile at a time)."""
        _reconciling.set(key)

    def observe_reconcile(self, key: Key, result: str, seconds: float) -> None:
        """A reconcile of `key` ended: its duration; registry requests are no longer its."""
        _reconciling.set(None)
        self.reconciles.labels(result).inc()
        self.reconcile_seconds.labels(result).observe(seconds)
        if self._exists(key):  # deleted meanwhile: `forget` dropped its series, keep them dropped
            self.graph_reconcile_seconds.observe(key, seconds)

    def internal_error(self, step: str, exc: BaseException) -> None:
        """A reconcile step (reconcile.STEPS) failed with an exception of no known kind."""
        self.internal_errors.labels(step, type(exc).__name__).inc()

    def observe_fetch(self, status: int | None, seconds: float, n_bytes: int) -> None:
        """One registry request (the fetcher's callback), also counted for the ServeGraph being reconciled."""
        code = str(status) if status is not None else "error"
        self.fetch_seconds.labels(code).observe(seconds)
        self.fetch_responses.labels(code).inc()
        if n_bytes:
            self.fetch_bytes.inc(n_bytes)
        key = _reconciling.get()
        if key is not None and self._exists(key):
            self.graph_fetch_seconds.observe(key, seconds)

    def observe_status(self, key: Key, old: Mapping[str, Any], new: Mapping[str, Any]) -> None:
        """A reconcile's status for a ServeGraph: the live graph."""
        graph = new.get("graph") or {}
        if graph.get("digest"):
            self._live[key] = {
                "graph": str(graph.get("name", "")),
                "version": str(graph.get("version", "")),
                "digest": str(graph["digest"]),
            }

    def rollout_started(self, key: Key, graph: str) -> None:
        """Series at 0 while a rollout is under way, so increase() over a range counts its first outcome."""
        for outcome in ROLLOUT_OUTCOMES:
            self.rollouts.inc(key, (graph, outcome), 0)

    def record_rollout(self, key: Key, outcome: str, graph: str = "") -> None:
        """Count one rollout of ServeGraph `key` that ended with `outcome` (one of ROLLOUT_OUTCOMES)."""
        self.rollouts.inc(key, (graph, outcome))

    def forget(self, key: Key) -> None:
        """A ServeGraph was deleted: drop its per-ServeGraph series."""
        self._live.pop(key, None)
        for per_graph in (self.graph_fetch_seconds, self.graph_reconcile_seconds, self.rollouts):
            per_graph.remove(key)

    def watch_conditions(self, snapshot: Callable[[], Iterable[tuple[str, str]]]) -> None:
        self.registry.register(_ConditionCollector(snapshot))

    def watch_downloads(self, running: Callable[[], int], waiting: Callable[[], int]) -> None:
        """`servegraph_downloads` by state: in flight, and asked for and waiting for a place
        (downloads run beside the reconcile workers: operator/fetch/downloads.py)."""
        self.registry.register(_DownloadsCollector(running, waiting))

    def watch_servegraphs(self, exists: Callable[[Key], bool]) -> None:
        """Per-ServeGraph series only for ServeGraphs that still exist: a reconcile or a
        download that ends after its ServeGraph's deletion would otherwise bring back the
        series `forget` dropped, for ever (a leak per deleted ServeGraph)."""
        self._exists = exists

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
