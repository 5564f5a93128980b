"""Streams through a graph on a real Ray: items leave as they are produced, a client that goes
away stops the generator on its replica, a switch routes a stream by header, and a failure
mid-stream reaches the client as the last item."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from e2e_support import metric_total, scrape_metrics
from rayhead import RayHead

from servegraph_testbed.waiting import eventually


async def lines(http: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str] | None = None) -> list[Any]:
    async with http.post(url, json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["content-type"].startswith("application/x-ndjson")
        return [json.loads(line) async for line in resp.content if line.strip()]


async def stats(http: aiohttp.ClientSession, url: str) -> dict[str, int]:
    [counters] = await lines(http, url, {"stats": True})
    return counters  # type: ignore[no-any-return]


async def test_the_first_item_arrives_long_before_the_stream_ends(
    e2e_graph: Path, http: aiohttp.ClientSession, serve_url: Callable[[str], str]
) -> None:
    start = time.monotonic()
    arrivals: list[float] = []
    items: list[Any] = []
    async with http.post(serve_url("/stream"), json={"count": 5, "pause_s": 0.4}) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.strip():
                arrivals.append(time.monotonic() - start)
                items.append(json.loads(line))
    assert items == [{"tag": "a", "i": i} for i in range(5)]
    # 4 pauses of 0.4 s: the whole stream takes ≥ 1.6 s, the first item none of that.
    assert arrivals[-1] >= 1.6
    assert arrivals[0] < arrivals[-1] - 1.2, arrivals
    # Each item arrives on its own, about one pause after the one before.
    assert all(b - a > 0.2 for a, b in itertools.pairwise(arrivals)), arrivals


async def test_a_switch_routes_the_stream_by_header(
    e2e_graph: Path, http: aiohttp.ClientSession, serve_url: Callable[[str], str]
) -> None:
    url = serve_url("/stream")
    assert [x["tag"] for x in await lines(http, url, {"count": 2}, {"X-Model": "b"})] == ["b", "b"]
    assert [x["tag"] for x in await lines(http, url, {"count": 2})] == ["a", "a"]


async def test_server_sent_events_when_asked(
    e2e_graph: Path, http: aiohttp.ClientSession, serve_url: Callable[[str], str]
) -> None:
    async with http.post(serve_url("/stream"), json={"count": 2}, headers={"Accept": "text/event-stream"}) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        text = await resp.text()
    assert text == 'data: {"tag": "a", "i": 0}\n\ndata: {"tag": "a", "i": 1}\n\n'


async def test_a_failure_mid_stream_is_the_last_item_and_names_the_node(
    e2e_graph: Path, http: aiohttp.ClientSession, serve_url: Callable[[str], str]
) -> None:
    got = await lines(http, serve_url("/stream"), {"count": 5, "fail_at": 2})
    assert got[:2] == [{"tag": "a", "i": 0}, {"tag": "a", "i": 1}]
    assert got[2] == {
        "error": 'node "gen-a" failed: RuntimeError',  # the type only: the message is in the replica's log
        "node": "gen-a",
        "timed_out": False,
    }
    assert len(got) == 3


async def test_a_client_that_goes_away_stops_the_generator_on_its_replica(
    e2e_graph: Path, serve_url: Callable[[str], str], http: aiohttp.ClientSession
) -> None:
    url = serve_url("/stream")
    before = await stats(http, url)
    # Its own connection, closed after two items of a 100-item, 10-second stream.
    async with aiohttp.ClientSession() as own:
        resp = await own.post(url, json={"count": 100, "pause_s": 0.1})
        got = 0
        async for line in resp.content:
            if line.strip():
                got += 1
            if got == 2:
                break
        resp.close()
    # The cancellation travels proxy → router → generator; give it a moment, then see it counted.
    deadline = time.monotonic() + 20
    while True:
        now = await stats(http, url)
        if now["cancelled"] > before["cancelled"] or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.25)
    assert now["started"] == before["started"] + 1
    assert now["cancelled"] == before["cancelled"] + 1, (before, now)
    assert now["finished"] == before["finished"]
    produced = now["produced"] - before["produced"]
    await asyncio.sleep(1.0)
    later = await stats(http, url)
    assert later["produced"] == now["produced"], "the generator kept producing for nobody"
    assert produced < 50, f"produced {produced} of 100 items for a client that read 2"


async def test_streams_items_and_time_to_first_item_are_counted_per_edge(
    e2e_graph: Path, ray_head: RayHead, http: aiohttp.ClientSession, serve_url: Callable[[str], str]
) -> None:
    before = scrape_metrics(ray_head.metrics_port)
    for _ in range(3):
        assert len(await lines(http, serve_url("/stream"), {"count": 4}, {"X-Model": "b"})) == 4
    edge = {"graph": "e2e", "graph_version": "1"}

    def grew(name: str, by: float, **labels: str) -> bool:
        now = scrape_metrics(ray_head.metrics_port)
        was = metric_total(before.get(name, []), **edge, **labels)
        return metric_total(now.get(name, []), **edge, **labels) - was >= by

    async def exported() -> bool:
        return (
            grew("ray_servegraph_streams_total", 3, caller="http", node="front")
            and grew("ray_servegraph_streams_total", 3, caller="front", node="route")
            and grew("ray_servegraph_streams_total", 3, caller="route", node="gen-b")
            and grew("ray_servegraph_stream_items_total", 12, caller="route", node="gen-b")
            and grew("ray_servegraph_stream_items_total", 12, caller="http", node="front")
            and grew("ray_servegraph_stream_first_item_ms_count", 3, caller="route", node="gen-b")
        )

    await eventually(exported, within=90, interval=2, what="servegraph's stream metrics on Ray's endpoint")
