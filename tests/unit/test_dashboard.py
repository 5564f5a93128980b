"""The Grafana dashboard queries only metrics servegraph exports, by the labels they carry.

The node tier (tests/node/test_observability.py) runs these same queries against a real
Prometheus scraping real Ray pods; this catches a renamed metric or label in milliseconds.
"""

from __future__ import annotations

import json
import re
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from support import ROOT

from servegraph.operator.metrics import Metrics
from servegraph.runtime import telemetry

DASHBOARD = ROOT / "config" / "grafana" / "servegraph-overview.json"
CHART_COPY = ROOT / "charts" / "servegraph-operator" / "files" / "servegraph-overview.json"
_METRIC = re.compile(r"\b((?:ray_)?servegraph_[a-z_]+)\b")
_BY = re.compile(r"\bby \(([^)]*)\)")


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def queries() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p.get("targets", [])]


def runtime_series() -> dict[str, set[str]]:
    """What Ray exports for the routers' metrics: `ray_` prefixed, counters `_total`, histograms in parts."""
    edge = set(telemetry.EDGE_TAGS) | {"application", "deployment", "replica"}
    out = {
        f"ray_{telemetry.REQUESTS}_total": edge,
        f"ray_{telemetry.ERRORS}_total": edge | {"reason"},
        f"ray_{telemetry.RETRIES}_total": edge | {"reason"},
        f"ray_{telemetry.STREAMS}_total": edge,
        f"ray_{telemetry.ITEMS}_total": edge,
    }
    for part in ("bucket", "count", "sum"):
        for histogram in (telemetry.LATENCY, telemetry.FIRST_ITEM):
            out[f"ray_{histogram}_{part}"] = edge | ({"le"} if part == "bucket" else set())
    return out


def operator_series() -> dict[str, set[str]]:
    """Every series the operator exports once it has seen one ServeGraph, with its labels."""
    metrics = Metrics()
    key = ("ns", "sg")
    metrics.reconciling(key)
    metrics.observe_fetch(200, 0.1, 1)
    metrics.observe_reconcile(key, "success", 0.1)
    metrics.observe_status(key, {}, {"graph": {"name": "g", "version": "1", "digest": "sha256:x"}})
    metrics.record_rollout(key, "succeeded", "g")
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def test_every_query_names_an_exported_metric_and_groups_by_its_labels() -> None:
    known = {**runtime_series(), **operator_series()}
    for expr in queries():
        names = _METRIC.findall(expr)
        assert names, expr
        for name in names:
            assert name in known, f"{name} is not exported (in {expr})"
        labels = set().union(*(known[n] for n in names))
        for group in _BY.findall(expr):
            missing = {g.strip() for g in group.split(",")} - labels
            assert not missing, f"{expr}: groups by {missing}, which {names} do not carry"


def test_the_dashboard_covers_what_the_issue_asks_for() -> None:
    titles = [p["title"] for p in dashboard()["panels"]]
    for wanted in ("Requests", "Errors", "p50", "p99", "Live graph version", "Rollouts", "items", "first item"):
        assert any(wanted in t for t in titles), f"no panel for {wanted}: {titles}"
    for expr in queries():
        if "ray_servegraph_" in expr or "servegraph_graph_info" in expr:
            assert 'graph=~"$graph"' in expr, f"not filtered by the graph variable: {expr}"


def test_the_chart_ships_the_same_file() -> None:
    # Helm cannot read files outside the chart and kustomize refuses paths outside its
    # directory, so the chart holds a copy; it must stay byte-identical to config/grafana.
    assert CHART_COPY.read_bytes() == DASHBOARD.read_bytes(), (
        "charts/servegraph-operator/files/servegraph-overview.json differs from "
        "config/grafana/servegraph-overview.json: copy the config/ file over the chart's"
    )
