"""Seeing inside a graph on a real Ray 2.60: per-edge metrics on Ray's own metrics endpoint,
trace context and headers through the routers (and spans, with Ray Serve's tracing on),
and per-edge timeouts cutting a slow ensemble branch.

The graph is the shipped sample config/samples/observed.txtpb.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from e2e_support import SAMPLES, ensure_deployed, metric_total, request, scrape_metrics
from rayhead import RayHead

from servegraph_testbed.waiting import eventually

OBSERVED = SAMPLES / "observed.txtpb"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


@pytest.fixture
async def observed(ray_head: RayHead, serve_port: int) -> Path:
    await ensure_deployed(ray_head, OBSERVED)
    return OBSERVED


async def test_a_slow_optional_branch_is_cut_and_the_headers_reach_the_last_node(
    observed: Path, http: aiohttp.ClientSession, serve_url: Callable[[str], str]
) -> None:
    headers = {"traceparent": TRACEPARENT, "x-request-id": "r-42", "x-secret": "not forwarded"}
    started = time.monotonic()
    status, body = await request(http, serve_url("/review"), {"text": "a great day"}, headers=headers)
    elapsed = time.monotonic() - started
    assert status == 200, body
    assert body["node"] == "audit"
    assert body["payload"] == {
        "lexicon": {"label": "positive", "score": 1.0},
        "second-opinion": {
            "error": 'node "second-opinion" timed out after 0.5 s',
            "node": "second-opinion",
            "timed_out": True,
        },
    }
    assert elapsed < 1.9, f"the 2 s branch was not cut at 0.5 s ({elapsed:.2f} s)"
    # The last node of the sequence got the trace (same trace id) and the configured header only.
    received = body["headers"]
    assert set(received) == {"traceparent", "x-request-id"}
    assert received["traceparent"].split("-")[1] == TRACE_ID
    assert received["x-request-id"] == "r-42"


async def test_a_required_member_timing_out_answers_504_naming_it(
    observed: Path, http: aiohttp.ClientSession, serve_url: Callable[[str], str]
) -> None:
    status, body = await request(http, serve_url("/strict"), {"delay_s": 0})
    assert status == 200, body
    assert set(body) == {"quick", "laggard"}

    started = time.monotonic()
    status, body = await request(http, serve_url("/strict"), {"delay_s": 3})
    assert time.monotonic() - started < 2.5
    assert (status, body) == (
        504,
        {"error": 'node "laggard" timed out after 0.5 s', "node": "laggard", "timed_out": True},
    )


async def test_every_router_hop_is_counted_on_rays_metrics_endpoint_with_the_graph_identity(
    observed: Path, ray_head: RayHead, http: aiohttp.ClientSession, serve_url: Callable[[str], str]
) -> None:
    before = scrape_metrics(ray_head.metrics_port)
    n = 5
    for _ in range(n):
        status, _ = await request(http, serve_url("/review"), {"text": "good"})
        assert status == 200
    status, _ = await request(http, serve_url("/strict"), {"delay_s": 3})
    assert status == 504
    edge = {"graph": "observed", "graph_version": "1"}

    def grew(name: str, by: float, **labels: str) -> bool:
        now = scrape_metrics(ray_head.metrics_port)
        return (
            metric_total(now.get(name, []), **edge, **labels) - metric_total(before.get(name, []), **edge, **labels)
            >= by
        )

    async def all_exported() -> bool:
        # Ray's metrics agent exports what replicas record every few seconds.
        return (
            grew("ray_servegraph_requests_total", n, caller="http", node="pipeline", application="review")
            and grew("ray_servegraph_requests_total", n, caller="pipeline", node="panel")
            and grew("ray_servegraph_requests_total", n, caller="pipeline", node="audit")
            and grew("ray_servegraph_requests_total", n, caller="panel", node="lexicon")
            and grew("ray_servegraph_request_errors_total", n, caller="panel", node="second-opinion", reason="timeout")
            and grew("ray_servegraph_request_errors_total", 1, caller="http", node="quorum", reason="timeout")
            and grew("ray_servegraph_request_latency_ms_count", n, caller="pipeline", node="panel")
        )

    await eventually(all_exported, within=90, interval=2, what="servegraph's edge metrics on Ray's endpoint")
    latency = scrape_metrics(ray_head.metrics_port)["ray_servegraph_request_latency_ms_bucket"]
    panel_buckets = {
        tags["le"]: v for tags, v in latency if tags.get("caller") == "pipeline" and tags.get("node") == "panel"
    }
    # The panel waits for its 0.5 s cut: no call to it is under 250 ms, every one under 2.5 s.
    assert panel_buckets["250.0"] == 0
    assert panel_buckets["2500.0"] == panel_buckets["+Inf"] > 0
    labels = next(tags for tags, _ in latency if tags.get("node") == "panel")
    assert {"deployment", "replica", "application"} <= set(labels), "Serve's own labels are added"
    assert labels["deployment"] == "pipeline" and labels["application"] == "review"


async def test_with_ray_serve_tracing_each_hop_is_a_span_in_the_callers_trace(
    observed: Path, spans_file: Path, http: aiohttp.ClientSession, serve_url: Callable[[str], str]
) -> None:
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    headers = {"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"}
    status, body = await request(http, serve_url("/review"), {"text": "good"}, headers=headers)
    assert status == 200, body

    def ours() -> list[dict[str, Any]]:
        lines = spans_file.read_text().splitlines() if spans_file.exists() else []
        spans = [json.loads(line) for line in lines]
        return [s for s in spans if s["trace"] == trace_id and "servegraph.node" in s["attributes"]]

    async def all_hops() -> list[dict[str, Any]] | None:
        found = ours()
        names = {s["name"] for s in found}
        want = {"http -> pipeline", "pipeline -> panel", "panel -> lexicon", "panel -> second-opinion"}
        return found if want | {"pipeline -> audit"} <= names else None

    spans = await eventually(all_hops, within=60, interval=1, what="a span per hop in the request's trace")
    by_name = {s["name"]: s for s in spans}
    assert by_name["panel -> lexicon"]["attributes"]["servegraph.graph"] == "observed"
    # What reached the last node names the span of the hop that called it.
    assert body["headers"]["traceparent"] == f"00-{trace_id}-{by_name['pipeline -> audit']['id']}-01"
