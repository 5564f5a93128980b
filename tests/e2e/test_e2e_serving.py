"""Graph → Serve config → real Ray → HTTP: each router kind serves what its graph says."""

from __future__ import annotations

import asyncio
import copy
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from e2e_support import request
from rayhead import RayHead

from servegraph.graph import load_graph
from servegraph.raydash import up
from servegraph.raydash.dashboard import RayDashboard
from servegraph.render.serve_config import serve_config_yaml


async def test_sequence_calls_three_steps_in_order(
    e2e_graph: Path, http: aiohttp.ClientSession, serve_url: Callable[[str], str]
) -> None:
    status, body = await request(http, serve_url("/chain"), {"x": 1})
    assert status == 200
    assert body == {"x": 1, "trail": ["a", "b", "c"]}


async def test_ensemble_fans_out_and_combines(
    e2e_graph: Path, http: aiohttp.ClientSession, serve_url: Callable[[str], str]
) -> None:
    status, body = await request(http, serve_url("/fanout"), {"x": 5})
    assert status == 200
    assert body == {"total": 25.0, "parts": {"double": 10.0, "triple": 15.0}}


async def test_switch_routes_on_field_then_on_header_below_it(
    e2e_graph: Path, http: aiohttp.ClientSession, serve_url: Callable[[str], str]
) -> None:
    url = serve_url("/switch")
    tagged = {"kind": "tagged"}
    # The header switch is the field switch's child: the header reaches it through `route`.
    assert await request(http, url, tagged) == (200, {"tag": "a", "payload": tagged})
    assert await request(http, url, tagged, headers={"X-Variant": "b"}) == (200, {"tag": "b", "payload": tagged})
    assert await request(http, url, {"kind": "other"}) == (200, {"echo": {"kind": "other"}})
    # Not JSON: the payload is the text, which has no fields, so the default (a function node) answers.
    assert await request(http, url, data="hello there") == (200, {"echo": "hello there"})


async def test_splitter_sends_90_10_over_2000_requests(
    e2e_graph: Path, http: aiohttp.ClientSession, serve_url: Callable[[str], str]
) -> None:
    url = serve_url("/canary")
    limit = asyncio.Semaphore(32)

    async def one(i: int) -> str:
        async with limit:
            status, body = await request(http, url, {"i": i})
        assert status == 200 and body["payload"] == {"i": i}
        return str(body["tag"])

    started = time.monotonic()
    tags = Counter(await asyncio.gather(*(one(i) for i in range(2000))))
    elapsed = time.monotonic() - started
    share = tags["stable"] / 2000
    print(f"splitter: stable {share:.2%}, candidate {tags['candidate'] / 2000:.2%} in {elapsed:.1f}s")
    assert set(tags) == {"stable", "candidate"}
    # each splitter spreads its routes by a golden-ratio sequence: within ~3 requests of the
    # weight per router replica (random draws strayed by ~13 requests at 1 sd)
    assert abs(tags["stable"] - 1800) <= 12, tags


async def test_user_config_change_reconfigures_the_running_replica(
    e2e_graph: Path,
    dash: RayDashboard,
    http: aiohttp.ClientSession,
    serve_url: Callable[[str], str],
) -> None:
    url = serve_url("/config")
    status, before = await request(http, url)
    assert status == 200 and before["threshold"] == 1

    _, config = up.render(e2e_graph)
    changed = copy.deepcopy(config)
    (app,) = [a for a in changed["applications"] if a["name"] == "config"]
    (options,) = [d for d in app["deployments"] if d["name"] == "conf"]
    options["user_config"] = {"threshold": 2}
    try:
        await dash.put_applications(changed)
        after = await _wait_for(lambda: request(http, url), lambda r: r[1]["threshold"] == 2)
        assert after[1]["replica_id"] == before["replica_id"]
        assert after[1]["pid"] == before["pid"]
        assert after[1]["reconfigures"] == before["reconfigures"] + 1
    finally:
        await dash.put_applications(config)


async def test_cluster_runs_exactly_the_operators_serve_config_v2(
    e2e_graph: Path, dash: RayDashboard, ray_head: RayHead
) -> None:
    serve_config_v2 = serve_config_yaml(load_graph(e2e_graph), ready=True)
    text, sent = up.render(e2e_graph)
    # `up` sends the parse of the very string the operator puts in the RayService (canaries on)...
    assert text == serve_config_v2
    assert sent == yaml.safe_load(serve_config_v2)
    # ...and that is what Serve holds for each application.
    state = await dash.get_applications()
    for app in sent["applications"]:
        assert state.applications[app["name"]].deployed_app_config == app


async def _wait_for(fetch: Callable[[], Any], done: Callable[[Any], bool], timeout_s: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = await fetch()
        if done(result) or time.monotonic() > deadline:
            return result
        await asyncio.sleep(0.5)
