"""A canary's evidence read from Prometheus' HTTP API (src/servegraph/evidence/prometheus.py).

Here a small HTTP server on loopback answers the instant queries with vectors as Prometheus
shapes them; the node tier reads the same figures from a real Prometheus scraping the Ray
pods (tests/node/test_canary.py).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from servegraph.evidence import Counts
from servegraph.evidence.prometheus import EvidenceError, PrometheusEvidence, Query, queries

QUERY = Query("team-a", "fraud", live_version="1", canary_version="2", window_s=42.3, applications={"scorer": "a"})


def vector(*samples: tuple[dict[str, str], float]) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": m, "value": [0, str(v)]} for m, v in samples]},
    }


def answer_for(promql: str) -> dict[str, Any]:
    version = "2" if 'graph_version="2"' in promql else "1"
    mirror = 'caller=~"mirror"' in promql
    by_node = "by (node)" in promql or "by (le, node)" in promql
    if mirror:
        return vector(({}, float("nan")))  # no mirrored requests: Prometheus answers NaN
    if "quantile" in promql:
        value = {"1": 40.0, "2": 130.0}[version]
        return vector(({"node": "scorer"}, value)) if by_node else vector(({}, value))
    errors = "errors" in promql
    if by_node:
        return vector(({"node": "scorer"}, 12.0 if errors else 120.0), ({"node": "ingress"}, 0.0 if errors else 120.0))
    if version == "2":
        return vector(({}, 12.0 if errors else 120.0))
    return vector(({}, 1.0 if errors else 1080.0))


@pytest.fixture
async def prometheus() -> AsyncIterator[tuple[str, list[str]]]:
    seen: list[str] = []

    async def query(request: web.Request) -> web.Response:
        promql = request.query["query"]
        seen.append(promql)
        if "broken" in request.path:
            return web.Response(text="not json")
        return web.json_response(answer_for(promql))

    app = web.Application()
    app.router.add_get("/api/v1/query", query)
    app.router.add_get("/broken/api/v1/query", query)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", seen
    await runner.cleanup()


async def test_the_versions_and_nodes_are_read_over_the_window(prometheus: tuple[str, list[str]]) -> None:
    url, seen = prometheus
    evidence = await PrometheusEvidence(url).read(QUERY)
    assert evidence.source == "prometheus"
    assert evidence.canary == Counts(120, 12, 130.0)
    assert evidence.live == Counts(1080, 1, 40.0)
    assert evidence.mirrored == Counts(0, 0, None)
    scorer = next(n for n in evidence.nodes if n.node == "scorer")
    assert (scorer.application, scorer.canary, scorer.live_p99_ms) == ("a", Counts(120, 12, 130.0), 40.0)
    assert sorted(seen) == sorted(queries(QUERY).values())


def test_queries_select_the_servegraphs_namespace_graph_version_and_window() -> None:
    q = queries(QUERY)
    assert q["canary.requests"] == (
        'sum(increase(ray_servegraph_requests_total{namespace="team-a",graph="fraud",'
        'graph_version="2",caller=~"http|grpc"}[43s]))'
    )
    assert 'caller=~"mirror"' in q["mirrored.errors"]
    assert q["nodes.live.p99"].startswith("histogram_quantile(0.99, sum by (le, node) (increase(")
    hostile = Query('a"b', 'g"}or vector(1)#', "1", "2", 10)
    assert 'graph="g\\"}or vector(1)#"' in queries(hostile)["canary.requests"], "a label value was not escaped"


async def test_an_unreadable_prometheus_gives_no_verdict_but_an_error(prometheus: tuple[str, list[str]]) -> None:
    url, _ = prometheus
    with pytest.raises(EvidenceError, match="not an instant vector"):
        await PrometheusEvidence(url + "/broken").read(QUERY)
    with pytest.raises(EvidenceError, match="unreachable"):
        await PrometheusEvidence("http://127.0.0.1:9").read(QUERY)


def test_a_vector_is_parsed_as_prometheus_writes_it() -> None:
    from servegraph.evidence.prometheus import parse_vector

    body = json.dumps(vector(({"node": "n"}, 2.5), ({"node": "m"}, float("nan")))).encode()
    assert parse_vector(body, "p") == {"n": 2.5}
