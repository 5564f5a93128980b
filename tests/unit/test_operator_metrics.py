"""The operator's per-ServeGraph metrics: live graph, rollout outcomes, download and reconcile
latency — the rules one at a time, then through the reconciler in memory."""

from __future__ import annotations

import tracemalloc

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from reconcile_support import KEY, NAME, NS, Cluster
from test_reconcile_rollout import mini, ready, with_clock

from servegraph.gcpause import CollectorClock
from servegraph.operator.graph_metrics import GraphCounter, GraphHistogram
from servegraph.operator.metrics import PER_GRAPH_BUCKETS, Metrics


def samples(metrics: Metrics, name: str) -> list[tuple[dict[str, str], float]]:
    text = metrics.exposition().decode()
    return [
        (dict(s.labels), s.value) for f in text_string_to_metric_families(text) for s in f.samples if s.name == name
    ]


def test_downloads_count_for_the_servegraph_being_reconciled() -> None:
    metrics = Metrics()
    metrics.observe_fetch(200, 0.2, 10)  # outside any reconcile: only the operator-wide series
    assert samples(metrics, "servegraph_graph_fetch_duration_seconds_count") == []
    metrics.reconciling(KEY)
    metrics.observe_fetch(200, 0.2, 10)
    metrics.observe_fetch(None, 0.3, 0)
    metrics.observe_reconcile(KEY, "success", 0.6)
    metrics.observe_fetch(200, 0.2, 10)  # after it: not the ServeGraph's
    assert samples(metrics, "servegraph_graph_fetch_duration_seconds_count") == [({"namespace": NS, "name": NAME}, 2)]
    metrics.record_rollout(KEY, "rolled_back", "g")
    assert samples(metrics, "servegraph_graph_rollouts_total") == [
        ({"namespace": NS, "name": NAME, "graph": "g", "outcome": "rolled_back"}, 1)
    ]


def test_the_garbage_collectors_runs_and_cpu_by_generation() -> None:
    clock = CollectorClock()
    metrics = Metrics(gc_clock=clock)
    assert samples(metrics, "servegraph_gc_collections_total") == [({"generation": str(g)}, 0) for g in range(3)]
    clock.collections[2] += 3
    clock.seconds[2] += 0.25
    assert samples(metrics, "servegraph_gc_collections_total")[2] == ({"generation": "2"}, 3)
    assert samples(metrics, "servegraph_gc_cpu_seconds_total") == [
        ({"generation": "0"}, 0),
        ({"generation": "1"}, 0),
        ({"generation": "2"}, 0.25),
    ]


def test_the_operators_own_cpu_and_memory() -> None:
    metrics = Metrics()
    (cpu,) = samples(metrics, "process_cpu_seconds_total")
    (rss,) = samples(metrics, "process_resident_memory_bytes")
    assert cpu[1] > 0 and rss[1] > 10 * 2**20


async def test_the_live_graph_and_each_rollouts_outcome_through_the_reconciler() -> None:
    c = with_clock(Cluster())
    metrics = c.reconciler.metrics
    c.publish(mini("1"))
    await c.started()
    ((labels, value),) = samples(metrics, "servegraph_graph_info")
    assert labels == {"namespace": NS, "name": NAME, "graph": "mini", "version": "1", "digest": labels["digest"]}
    assert labels["digest"].startswith("sha256:") and value == 1

    def rollouts() -> dict[str, float]:
        found = samples(metrics, "servegraph_graph_rollouts_total")
        assert {(t["namespace"], t["name"], t["graph"]) for t, _ in found} <= {(NS, NAME, "mini")}
        return {t["outcome"]: v for t, v in found}

    # While a rollout is under way its outcomes exist at 0, so increase() sees the first one.
    assert rollouts() == {"succeeded": 0, "failed": 0, "rolled_back": 0, "superseded": 0}
    await ready(c)
    assert rollouts() == {"succeeded": 1, "failed": 0, "rolled_back": 0, "superseded": 0}

    c.publish(mini("2", ["fine"]))
    await c.reconcile()  # applies version 2
    assert samples(metrics, "servegraph_graph_info")[0][0]["version"] == "2"
    c.publish(mini("3", ["finer"]))
    await c.reconcile()  # version 3 before 2 was Ready
    assert rollouts()["superseded"] == 1
    await ready(c, "DEPLOY_FAILED")  # v3 fails: back to v1
    assert rollouts() == {"succeeded": 1, "failed": 0, "rolled_back": 1, "superseded": 1}
    await ready(c)  # v1 Ready again
    assert rollouts() == {"succeeded": 2, "failed": 0, "rolled_back": 1, "superseded": 1}

    deleted = dict(c.body)
    c.reconciler.servegraph_changed(deleted, deleted=True)
    for name in ("servegraph_graph_info", "servegraph_graph_rollouts_total"):
        assert samples(metrics, name) == []
    assert samples(metrics, "servegraph_graph_reconcile_duration_seconds_count") == []


async def test_a_reconcile_ending_after_its_servegraphs_deletion_brings_no_series_back() -> None:
    """The deletion drops the series while a reconcile (and its download) is still running;
    what that reconcile observes afterwards must not create them again."""
    c = with_clock(Cluster())
    metrics = c.reconciler.metrics
    c.publish(mini("1"))
    await c.started()
    metrics.reconciling(KEY)  # a reconcile in flight ...
    c.reconciler.servegraph_changed(dict(c.body), deleted=True)  # ... when the ServeGraph goes
    metrics.observe_fetch(200, 0.2, 10)
    metrics.observe_reconcile(KEY, "success", 0.6)
    for name in ("servegraph_graph_fetch_duration_seconds_count", "servegraph_graph_reconcile_duration_seconds_count"):
        assert samples(metrics, name) == [], name
    assert samples(metrics, "servegraph_reconciles_total"), "the operator-wide series still count it"


def _exposed(registry: CollectorRegistry) -> list[tuple[str, list[tuple[str, str]], float]]:
    text = generate_latest(registry).decode()
    found = [
        (s.name, sorted(s.labels.items()), s.value) for f in text_string_to_metric_families(text) for s in f.samples
    ]
    return sorted(s for s in found if not s[0].endswith("_created"))


OBSERVED = [0.0, 0.004, 0.01, 0.0100001, 0.05, 0.3, 1.0, 2.5, 29.9, 30.0, 31.0, 1e9]


def test_a_per_servegraph_histogram_exposes_what_prometheus_clients_own_would() -> None:
    ours_registry, theirs_registry = CollectorRegistry(), CollectorRegistry()
    ours = GraphHistogram("g_seconds", "help", PER_GRAPH_BUCKETS)
    ours_registry.register(ours)
    theirs = Histogram("g_seconds", "help", ["namespace", "name"], buckets=PER_GRAPH_BUCKETS, registry=theirs_registry)
    for i, value in enumerate(OBSERVED):
        key = (NS, f"sg-{i % 3}")
        ours.observe(key, value)
        theirs.labels(*key).observe(value)
    assert _exposed(ours_registry) == _exposed(theirs_registry)
    ours.remove((NS, "sg-1"))
    theirs.remove(NS, "sg-1")
    assert _exposed(ours_registry) == _exposed(theirs_registry)


def test_a_per_servegraph_counter_exposes_what_prometheus_clients_own_would() -> None:
    ours_registry, theirs_registry = CollectorRegistry(), CollectorRegistry()
    ours = GraphCounter("r", "help", ["graph", "outcome"])
    ours_registry.register(ours)
    theirs = Counter("r", "help", ["namespace", "name", "graph", "outcome"], registry=theirs_registry)
    for key, labels, amount in [
        ((NS, "a"), ("g", "failed"), 0),
        ((NS, "a"), ("g", "failed"), 1),
        ((NS, "b"), ("h", "succeeded"), 2),
    ]:
        ours.inc(key, labels, amount)
        theirs.labels(*key, *labels).inc(amount)
    assert _exposed(ours_registry) == _exposed(theirs_registry)


def test_per_servegraph_series_cost_little_memory() -> None:
    """Issue 25: prometheus_client's labelled children came to ~9 KiB per ServeGraph for
    these series (two histograms, four rollout counters): 90 MiB at 10,000 ServeGraphs."""
    metrics = Metrics()
    keys = [(f"ns-{i % 10}", f"sg-{i:05d}") for i in range(1000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for key in keys:
            metrics.graph_reconcile_seconds.observe(key, 0.02)
            metrics.graph_fetch_seconds.observe(key, 0.01)
            metrics.rollout_started(key, "tenant-graph")
        per = (tracemalloc.get_traced_memory()[0] - before) / len(keys)
    finally:
        tracemalloc.stop()
    assert per < 2048, f"{per:.0f} bytes of metrics per ServeGraph"
