"""Metric families with series per ServeGraph, held as a few numbers per ServeGraph.

prometheus_client keeps each labelled child as a whole metric object with a lock per
value: two 10-bucket histograms and four rollout counters came to ~9 KiB per ServeGraph
(90 MiB at 10,000). The operator updates these from its event loop only, so here each
ServeGraph is a row of floats, and the families are built when scraped.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from servegraph.names import Key

PER_GRAPH = ["namespace", "name"]

_le: Callable[[float], str] = floatToGoString
"""A bucket bound as prometheus_client's own histograms write it (0.01, 1.0, +Inf)."""


class GraphHistogram(Collector):
    """A histogram with a series per ServeGraph: per ServeGraph its bucket counts (not
    cumulative; the last one is +Inf) and the sum of what was observed."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float]) -> None:
        self.name, self.documentation = name, documentation
        self.buckets = tuple(sorted(buckets))
        self._les = [_le(b) for b in self.buckets] + ["+Inf"]
        self._rows: dict[Key, array[float]] = {}

    def observe(self, key: Key, value: float) -> None:
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = array("d", bytes(8 * (len(self.buckets) + 2)))
        row[bisect_left(self.buckets, value)] += 1  # a value equal to a bound counts in its bucket
        row[-1] += value

    def remove(self, key: Key) -> None:
        self._rows.pop(key, None)

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=PER_GRAPH)
        for key, row in sorted(list(self._rows.items())):
            running, buckets = 0.0, []
            for le, count in zip(self._les, row[:-1], strict=True):
                running += count
                buckets.append((le, running))
            family.add_metric(list(key), buckets, row[-1])
        yield family


class GraphCounter(Collector):
    """A counter with a series per ServeGraph and further labels."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str]) -> None:
        self.name, self.documentation = name, documentation
        self.labels = [*PER_GRAPH, *labels]
        self._rows: dict[Key, dict[tuple[str, ...], float]] = {}

    def inc(self, key: Key, labels: tuple[str, ...], amount: float = 1.0) -> None:
        row = self._rows.setdefault(key, {})
        row[labels] = row.get(labels, 0.0) + amount

    def remove(self, key: Key) -> None:
        self._rows.pop(key, None)

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for key, row in sorted(list(self._rows.items())):
            for labels, value in sorted(row.items()):
                family.add_metric([*key, *labels], value)
        yield family
