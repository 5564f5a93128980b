"""Prometheus metrics of the operator, in a registry of its own."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


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


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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

    def observe_fetch(self, status: int | None, seconds: float, n_bytes: int) -> None:
        code = str(status) if status is not None else "error"
        self.fetch_seconds.labels(code).observe(seconds)
        self.fetch_responses.labels(code).inc()
        if n_bytes:
            self.fetch_bytes.inc(n_bytes)

    def watch_conditions(self, snapshot: Callable[[], Iterable[tuple[str, str]]]) -> None:
        self.registry.register(_ConditionCollector(snapshot))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
