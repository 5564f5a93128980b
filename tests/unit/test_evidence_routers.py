"""A canary's evidence from the routers' own counters (src/servegraph/evidence/routers.py).

A small HTTP server on loopback answers each application's route as the ingress router does
for `x-servegraph-stats` (the JSON of runtime/stats.py, docs/runtime.md); tests/e2e and the
node tier read the real routers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from servegraph.evidence import Counts, EvidenceError, Request
from servegraph.evidence.routers import RoutersEvidence, quantile

BUCKETS = [1, 2.5, 5, 10, 25, 50, 100]
TOKEN = "t0ken"


def kind(requests: int, errors: int, counts: list[int], failed: dict[str, int] | None = None) -> dict[str, Any]:
    return {
        "requests": requests,
        "errors": errors,
        "failed_nodes": failed or {},
        "latency_ms": {"buckets": BUCKETS, "counts": counts, "sum": 0.0},
    }


class Routers:
    """The ingress routers of two applications, their totals moved by the test."""

    def __init__(self) -> None:
        self.totals: dict[str, dict[str, Any]] = {"a": {}, "b": {}}
        self.seen_tokens: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.seen_tokens.append(request.headers.get("x-servegraph-stats", ""))
        if request.headers.get("x-servegraph-stats") != TOKEN:
            return web.Response(status=403)
        app = request.path.strip("/")
        return web.json_response({"graph": "g", "live": "1", "canary": "2", "versions": self.totals[app]})


@pytest.fixture
async def routers() -> AsyncIterator[tuple[Routers, str]]:
    r = Routers()
    app = web.Application()
    app.router.add_get("/{app}", r.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield r, f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


def request(window: str = "w1", token: str = TOKEN) -> Request:
    return Request("ns", "rs", "g", "1", "2", window, 30.0, {"model": "a"}, {"a": "/a", "b": "b"}, token=token)


async def test_the_window_counts_from_its_first_read_summed_over_applications(routers: tuple[Routers, str]) -> None:
    r, url = routers
    reader = RoutersEvidence(serve_url=lambda ns, rs: url)
    r.totals["a"] = {
        "2": {"clients": kind(10, 1, [0, 0, 5, 5, 0, 0, 0, 0])},
        "1": {"clients": kind(90, 0, [0, 0, 90, 0, 0, 0, 0, 0])},
    }
    first = await reader.read_canary(request())
    assert first.canary == Counts(0, 0, None), "the first read of a window is its baseline"
    r.totals["a"] = {
        "2": {
            "clients": kind(60, 11, [0, 0, 5, 55, 0, 0, 0, 0], {"model": 10}),
            "mirror": kind(4, 0, [4, 0, 0, 0, 0, 0, 0, 0]),
        },
        "1": {"clients": kind(390, 0, [0, 0, 390, 0, 0, 0, 0, 0])},
    }
    r.totals["b"] = {"2": {"clients": kind(0, 0, [0] * 8)}}
    second = await reader.read_canary(request())
    assert (second.canary.requests, second.canary.errors) == (50, 10)
    assert second.canary.p99_ms is not None and 5 < second.canary.p99_ms <= 10
    assert (second.live.requests, second.live.errors) == (300, 0)
    assert second.mirrored.requests == 4, "a kind first seen after the baseline counts all its requests"
    (node,) = second.nodes
    assert (node.application, node.node, node.canary.errors) == ("a", "model", 10)
    assert set(r.seen_tokens) == {TOKEN}
    assert (await reader.read_canary(request(window="w2"))).canary == Counts(0, 0, None), "a new step, a new baseline"


async def test_a_refused_token_or_an_unreachable_router_gives_no_verdict(routers: tuple[Routers, str]) -> None:
    _, url = routers
    with pytest.raises(EvidenceError, match="answered HTTP 403"):
        await RoutersEvidence(serve_url=lambda ns, rs: url).read_canary(request(token="wrong"))
    with pytest.raises(EvidenceError, match="unreachable"):
        await RoutersEvidence(serve_url=lambda ns, rs: "http://127.0.0.1:9").read_canary(request())


def test_the_quantile_is_interpolated_within_its_bucket_as_prometheus_does() -> None:
    assert quantile(0.5, [10, 20], [0, 10, 0]) == 15.0
    assert quantile(0.99, [10, 20], [100, 0, 0]) == pytest.approx(9.9)
    assert quantile(0.99, [10, 20], [0, 0, 5]) == 20.0, "above the last bucket: its bound"
    assert quantile(0.99, [10, 20], [0, 0, 0]) is None
