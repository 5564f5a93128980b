"""Seeing inside a serving graph on the real node: a real Prometheus scrapes the Ray pods
and the operator through the shipped monitors, and the Grafana dashboard's own queries
return per-node series with the graph's version; a traceparent reaches the last node of
a sequence; a slow ensemble branch is cut at its timeout; `servegraph status` draws it.

One deployment of config/samples/observed.txtpb serves the whole module (a Ray cluster
takes minutes to start on this node); the tests run in file order, each adding traffic.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from google.protobuf import text_format
from node_support import deploy, discard, wait_ready
from support import ROOT, SAMPLES

from servegraph.v1 import graph_pb2
from servegraph_testbed.node.prometheus import Prometheus
from servegraph_testbed.node.routes import answer
from servegraph_testbed.node.stack import Stack
from servegraph_testbed.waiting import eventually

DASHBOARD = ROOT / "config" / "grafana" / "servegraph-overview.json"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
CALLED_BY_ROUTERS = {"pipeline", "panel", "audit", "lexicon", "second-opinion", "quorum", "quick", "laggard"}


@dataclass(frozen=True)
class Deployed:
    namespace: str
    name: str
    digest: str
    review: str
    strict: str


@pytest.fixture(scope="module")
def prometheus(stack: Stack) -> Iterator[Prometheus]:
    with Prometheus(stack.cluster) as prom:
        yield prom


@pytest.fixture(scope="module")
async def observed(stack: Stack, prometheus: Prometheus) -> AsyncIterator[Deployed]:
    namespace = f"t-obs-{uuid.uuid4().hex[:6]}"
    graph = text_format.Parse((SAMPLES / "observed.txtpb").read_text(), graph_pb2.Graph())
    await deploy(stack, namespace, "observed", graph)
    try:
        await wait_ready(stack, namespace, "observed", within=600)
        review = stack.serve_url(namespace, "observed", "/review")
        # KubeRay reports Ready in about the instant the Service's endpoint does, when a new
        # connection can still be dropped inside the node (docs/testenv.md, "Requests right
        # after Ready"): the tests start once the route has answered, a lost request resent.
        status, body = await answer(review, {"text": "first"})
        assert status == 200, body
        yield Deployed(
            namespace,
            "observed",
            "sha256:" + hashlib.sha256(graph.SerializeToString()).hexdigest(),
            review,
            stack.serve_url(namespace, "observed", "/strict"),
        )
    finally:
        discard(stack, namespace)


async def post(url: str, payload: Any, headers: dict[str, str] | None = None) -> tuple[int, Any, float]:
    started = time.monotonic()
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.post(url, json=payload, headers=headers) as resp,
    ):
        body = await resp.json(content_type=None)
        return resp.status, body, time.monotonic() - started


async def test_a_traceparent_reaches_the_last_node_of_the_sequence_with_its_trace_id(observed: Deployed) -> None:
    headers = {"traceparent": TRACEPARENT, "tracestate": "sg=1", "x-request-id": "r-7", "cookie": "private"}
    status, body, _ = await post(observed.review, {"text": "a great day"}, headers)
    assert status == 200, body
    assert body["node"] == "audit", "audit is the sequence's last step"
    received = body["headers"]
    assert received["traceparent"].split("-")[1] == TRACE_ID
    # No tracer provider in these pods: the context passes through untouched.
    assert received == {"traceparent": TRACEPARENT, "tracestate": "sg=1", "x-request-id": "r-7"}


async def test_a_slow_ensemble_branch_is_cut_at_its_timeout_and_the_response_names_it(observed: Deployed) -> None:
    status, body, elapsed = await post(observed.review, {"text": "a great day"})
    assert status == 200, body
    assert body["payload"]["second-opinion"] == {
        "error": 'node "second-opinion" timed out after 0.5 s',
        "node": "second-opinion",
        "timed_out": True,
    }
    assert body["payload"]["lexicon"] == {"label": "positive", "score": 1.0}
    assert elapsed < 1.9, f"answered in {elapsed:.2f} s: the 2 s branch was not cut at 0.5 s"

    status, body, elapsed = await post(observed.strict, {"delay_s": 3})
    assert (status, body) == (
        504,
        {"error": 'node "laggard" timed out after 0.5 s', "node": "laggard", "timed_out": True},
    )
    assert elapsed < 2.5
    status, body, _ = await post(observed.strict, {"delay_s": 0})
    assert status == 200 and set(body) == {"quick", "laggard"}, body


def dashboard_queries(graph: str) -> dict[str, str]:
    """Each panel's query as Grafana would send it with the graph variable set to `graph`."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    out = {}
    for panel in panels:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$graph", graph)
            out[panel["title"]] = expr.replace("$__rate_interval", "1m").replace("$__range", "30m")
    return out


async def traffic(observed: Deployed, seconds: float) -> int:
    """Requests to both routes for `seconds`: /review always cuts a branch, /strict times out one in four."""
    sent = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        status, _, _ = await post(observed.review, {"text": "good"})
        assert status == 200
        status, _, _ = await post(observed.strict, {"delay_s": 3 if sent % 4 == 0 else 0})
        assert status in (200, 504)
        sent += 1
    return sent


def by(rows: list[dict[str, Any]], *labels: str) -> dict[tuple[str, ...], float]:
    return {tuple(r["metric"].get(label, "") for label in labels): float(r["value"][1]) for r in rows}


async def test_the_dashboards_queries_return_per_node_series_with_the_graph_version(
    stack: Stack, prometheus: Prometheus, observed: Deployed
) -> None:
    queries = dashboard_queries("observed")
    key = (observed.namespace, observed.name)
    sent = await traffic(observed, 45)
    assert sent >= 10

    async def answered() -> dict[str, list[dict[str, Any]]] | None:
        results = {title: await asyncio.to_thread(prometheus.query, expr) for title, expr in queries.items()}
        requests = by(results["Requests per second by node"], "node", "graph_version")
        if {node for node, _ in requests} != CALLED_BY_ROUTERS:
            return None
        if not results["Live graph version"] or not results["Reconcile p99 by ServeGraph"]:
            return None
        return results

    try:
        results = await eventually(answered, within=180, interval=3, what="every node in the dashboard's queries")
    except AssertionError:
        pytest.fail(f"{json.dumps(prometheus.targets(), indent=1)[:4000]}")

    requests = by(results["Requests per second by node"], "node", "graph_version")
    assert {version for _, version in requests} == {"1"}, requests
    assert all(rate > 0 for rate in requests.values()), requests
    errors = by(results["Errors per second by node"], "node", "reason", "graph_version")
    assert errors.get(("second-opinion", "timeout", "1"), 0) > 0, errors
    assert errors.get(("laggard", "timeout", "1"), 0) > 0, errors
    assert errors.get(("quorum", "timeout", "1"), 0) > 0, errors  # the 504s, seen at the ingress
    for title in ("p50 latency by node", "p99 latency by node"):
        latency = by(results[title], "node", "graph_version")
        assert {node for node, _ in latency} == CALLED_BY_ROUTERS, (title, latency)
        assert all(math.isfinite(v) and v > 0 for v in latency.values()), (title, latency)
    p50 = by(results["p50 latency by node"], "node")
    assert 250 <= p50[("second-opinion",)] <= 1000, "cut at 0.5 s: its calls last about 500 ms"
    assert p50[("panel",)] >= p50[("second-opinion",)] * 0.8, "the panel waits for the cut branch"
    assert by(results["Versions serving traffic"], "graph", "graph_version").keys() == {("observed", "1")}

    # The operator's side, scraped from its pods through the shipped ServiceMonitor.
    live = by(results["Live graph version"], "namespace", "name", "graph", "version", "digest")
    assert (*key, "observed", "1", observed.digest) in live, live
    rollouts = by(results["Rollouts by outcome"], "namespace", "name", "outcome")
    assert rollouts.get((*key, "succeeded"), 0) >= 0.5, rollouts
    for title in ("Reconcile p99 by ServeGraph", "Registry download p99 by ServeGraph"):
        assert key in by(results[title], "namespace", "name"), (title, results[title])

    # What was scraped: the Ray pods of the graph (head and worker) and both operator replicas.
    targets = await asyncio.to_thread(prometheus.targets)
    ray = [t for t in targets if t["labels"].get("namespace") == observed.namespace]
    assert len(ray) >= 2 and all(t["health"] == "up" for t in ray), ray
    operator = [t for t in targets if t["scrapePool"].startswith("servicemonitor/")]
    assert len(operator) == 2 and all(t["health"] == "up" for t in operator), operator
    # Those scrapes carried Prometheus' ServiceAccount token (metrics.auth, on by default):
    # without one, the same pods refuse.
    for target in operator:
        refused = await asyncio.to_thread(_status_without_token, target["scrapeUrl"])
        assert refused == 401, (target["scrapeUrl"], refused)


def _status_without_token(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return e.code


async def test_servegraph_status_draws_the_live_graph(stack: Stack, observed: Deployed) -> None:
    command = [sys.executable, "-m", "servegraph.cli", "status", observed.name, "-n", observed.namespace]
    command += ["--kubeconfig", str(stack.cp.kubeconfig())]
    out = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "Ready:         True  AllApplicationsRunning" in text, text
    assert f"Graph:         observed  version '1'  {observed.digest}  (2 applications, 9 nodes)" in text, text
    assert "Rollout:       version '1' " in text and "History:" in text, text
    assert "review  /review  RUNNING" in text and "strict  /strict  RUNNING" in text, text
    # Every node, in its place in the tree, HEALTHY, with its replicas counted live by Ray Serve.
    rows = {line.strip().lstrip("│├└─ ").split()[0]: line for line in text.splitlines() if "HEALTHY" in line}
    assert set(rows) == CALLED_BY_ROUTERS | {"tokenizer"}, text
    assert all("1/1 running" in row for row in rows.values()), text
    assert "├─ panel [step 1] (timeout 10s)" in text
    assert "second-opinion [member] (timeout 0.5s, optional)" in text

    missing = [*command[:4], "nope", "-n", observed.namespace, "--kubeconfig", str(stack.cp.kubeconfig())]
    gone = await asyncio.to_thread(subprocess.run, missing, capture_output=True, text=True, timeout=60)
    assert (gone.returncode, gone.stderr) == (1, f"servegraph status: ServeGraph {observed.namespace}/nope not found\n")
