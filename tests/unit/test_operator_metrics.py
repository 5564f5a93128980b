"""The operator's per-ServeGraph metrics: live graph, rollout outcomes, download and reconcile
latency — the rules one at a time, then through the reconciler in memory."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from reconcile_support import KEY, NAME, NS, Cluster
from test_reconcile_rollout import mini, ready, with_clock

from servegraph.operator.run.metrics import Metrics


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
