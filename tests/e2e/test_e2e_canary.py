"""A canary on a real Ray 2.60, deployed as `servegraph up`, `canary`, `promote` and `abort` do.

One story on a head of its own (Serve started by `servegraph up`, with GraphService, as on a
fresh cluster): version 1 serves; version 2 runs beside it at 30 % (the split, sticky keys,
the pin, HTTP streams and gRPC Call/Stream follow the choice; no base replica restarted);
version 2 is promoted (its replicas keep running, the base nodes it replaced go to zero
replicas, the side application it replaced none: it was the base); a broken version 3 is
mirrored at 20 % (every client answer from version 2, the copies counted and failing in
the routers' own stats, none reaching a client; its switch is a copy calling the base's
model by name) and aborted (its side application gone,
the live replicas untouched, the base node it used again back to zero); version 1 again
as a canary, promoted: exactly what `servegraph up` of version 1 deployed, no side application.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from subprocess import PIPE
from typing import Any

import aiohttp
import pytest
from e2e_support import GRAPHS, WORKER_PATH, metric_total, scrape_metrics
from rayhead import RayHead, free_port, running_head

from servegraph import grpc_client
from servegraph.raydash import canary as plain
from servegraph.raydash import up
from servegraph.raydash.dashboard import RayDashboard
from servegraph.render.canary import Split, side_app

V1, V2, BAD = GRAPHS / "canary.txtpb", GRAPHS / "canary-v2.txtpb", GRAPHS / "canary-bad.txtpb"
pytestmark = pytest.mark.timeout(1200)


@dataclass
class Cluster:
    head: RayHead
    http: str
    grpc: str
    target: plain.Target
    stats_token: str = ""


@pytest.fixture(scope="module")
def canary_head() -> Iterator[RayHead]:
    with running_head(num_cpus=2, extra_env={"PYTHONPATH": WORKER_PATH}) as head:
        yield head


@pytest.fixture(scope="module")
def cluster(canary_head: RayHead) -> Cluster:
    http_port, grpc_port = free_port(), free_port()
    err = io.StringIO()
    code = asyncio.run(
        up.up(
            V1,
            address=canary_head.address,
            token=canary_head.token,
            timeout_s=300,
            http_port=http_port,
            grpc_port=grpc_port,
            out=io.StringIO(),
            err=err,
        )
    )
    assert code == 0, err.getvalue()
    return Cluster(
        canary_head,
        f"http://127.0.0.1:{http_port}",
        f"127.0.0.1:{grpc_port}",
        plain.Target(canary_head.address, canary_head.token, 300),
    )


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=16)) as s:
        yield s


LIVE_STATES = frozenset({"RUNNING", "UPDATING"})
"""Serve's UPDATING is a replica reconfigured in place (a new autoscaling_config, routes in its
user_config): the same replica, actor and pid."""
NOT_STOPPING = LIVE_STATES | {"STARTING", "RECOVERING", "PENDING_MIGRATION"}
"""A node at zero has no replica in any of these: one UPDATING (scaled to zero but not yet
stopped) comes back RUNNING."""


async def replicas(
    cluster: Cluster, states: frozenset[str] = LIVE_STATES
) -> dict[tuple[str, str], set[tuple[str, str | None, int | None]]]:
    """(application, deployment) → {(replica id, actor id, pid)} of the replicas in `states`."""
    url = f"{cluster.head.address}/api/serve/applications/"
    headers = {"x-ray-authorization": f"Bearer {cluster.head.token}"}
    async with aiohttp.ClientSession() as s, s.get(url, params={"api_type": "declarative"}, headers=headers) as resp:
        doc = await resp.json()
    out = {}
    for app, details in doc["applications"].items():
        for name, dep in details["deployments"].items():
            out[app, name] = {
                (r["replica_id"], r.get("actor_id"), r.get("pid")) for r in dep["replicas"] if r["state"] in states
            }  # a STARTING replica has no actor or pid yet: Serve leaves the keys out
    return out


async def eventually(check: Callable[[], Awaitable[Any]], what: str, timeout_s: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g}s: {what}")
        await asyncio.sleep(0.5)


async def ask(
    s: aiohttp.ClientSession, cluster: Cluster, path: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    async with s.post(f"{cluster.http}{path}", json=body, headers=headers or {}) as resp:
        return resp.status, await resp.json(content_type=None)


async def many(
    s: aiohttp.ClientSession, cluster: Cluster, n: int, headers: Callable[[int], dict[str, str]]
) -> list[tuple[int, Any]]:
    gate = asyncio.Semaphore(16)

    async def one(i: int) -> tuple[int, Any]:
        async with gate:
            return await ask(s, cluster, "/ab", {"n": i}, headers(i))

    return await asyncio.gather(*(one(i) for i in range(n)))


def tags(answers: list[tuple[int, Any]]) -> Counter[str]:
    return Counter(body["tag"] if status == 200 else f"HTTP {status}" for status, body in answers)


async def canary(cluster: Cluster, path: Any, split: Split) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert await plain.start(path, split, cluster.target, out=out, err=err) == 0, err.getvalue()
    (token,) = re.findall(r"^stats: x-servegraph-stats: (\S+)$", out.getvalue(), re.MULTILINE)
    cluster.stats_token = token


async def cli(cluster: Cluster, *args: str) -> str:
    """`servegraph ARGS` as a user runs it (the token from the environment, as advised); its stdout."""
    env = {**os.environ, "RAY_AUTH_TOKEN": cluster.head.token, "RAY_DASHBOARD_ADDRESS": cluster.head.address}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "servegraph.cli", *args, env=env, stdout=PIPE, stderr=PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=600)
    assert proc.returncode == 0, err.decode()
    return out.decode()


def chat(cluster: Cluster, pin: str | None = None, stream: bool = False) -> Any:
    metadata = {"x-servegraph-version": pin} if pin else {}
    if stream:
        return [item["tag"] for item in grpc_client.stream(cluster.grpc, "chat", {"count": 2}, metadata, timeout_s=60)]
    return [item["tag"] for item in grpc_client.call(cluster.grpc, "chat", {"count": 2}, metadata, timeout_s=60)]


async def test_a_canary_at_30_percent_restarts_nothing_and_every_path_follows_its_choice(
    cluster: Cluster, session: aiohttp.ClientSession
) -> None:
    before = await replicas(cluster)
    printed = await cli(cluster, "canary", str(V2), "--weight", "30")
    assert re.search(r"^ab: canary copies in ab~[0-9a-f]{12}$", printed, re.MULTILINE), printed
    after = await replicas(cluster)
    assert {k: v for k, v in after.items() if not side_app(k[0])} == before  # no base replica restarted
    assert {name.split("~")[0] for name, _ in after if side_app(name)} == {"ab", "chat"}

    answers = await many(session, cluster, 400, lambda i: {})
    seen = tags(answers)
    assert set(seen) == {"y1", "y2"}, seen
    # the ingress spreads the versions by a golden-ratio sequence: within ~3 requests of the
    # weight per ingress replica (random draws strayed by ~9 requests at 1 sd); 15 % or 45 % fail
    assert abs(seen["y2"] - 120) <= 12, seen

    async def labelled() -> bool:  # each version's requests under its own graph_version, on Ray's endpoint
        requests = scrape_metrics(cluster.head.metrics_port).get("ray_servegraph_requests_total", [])
        at_front = {v: metric_total(requests, graph_version=v, caller="http", node="front") for v in ("1", "2")}
        return at_front == {"1": seen["y1"], "2": seen["y2"]}

    await eventually(labelled, "the front edge's requests per graph_version on Ray's metrics endpoint")

    await canary(cluster, V2, Split(weight=30, sticky_header="x-user"))  # again: the same side apps, a new split
    by_key = {}
    for key in [f"user-{i}" for i in range(40)]:
        sticky = tags(await many(session, cluster, 4, lambda i, k=key: {"x-user": k}))
        assert len(sticky) == 1, (key, sticky)
        by_key[key] = next(iter(sticky))
    assert set(by_key.values()) == {"y1", "y2"}

    assert tags(await many(session, cluster, 20, lambda i: {"x-servegraph-version": "2"})) == {"y2": 20}
    assert tags(await many(session, cluster, 20, lambda i: {"x-servegraph-version": "stable"})) == {"y1": 20}
    async with session.post(
        f"{cluster.http}/chat", json={"count": 2}, headers={"x-servegraph-version": "canary"}
    ) as resp:
        assert [json.loads(line)["tag"] for line in (await resp.text()).splitlines() if line] == ["a2", "a2"]
    assert await asyncio.to_thread(chat, cluster, "2") == ["a2", "a2"]
    assert await asyncio.to_thread(chat, cluster, "1", True) == ["a1", "a1"]
    assert await asyncio.to_thread(chat, cluster, "canary", True) == ["a2", "a2"]
    mixed = Counter([tuple(await asyncio.to_thread(chat, cluster, None, i % 2 == 0)) for i in range(40)])
    assert set(mixed) == {("a1", "a1"), ("a2", "a2")}  # each call one version, all of its items


async def test_promote_keeps_the_canarys_replicas_and_takes_the_old_nodes_to_zero(
    cluster: Cluster, session: aiohttp.ClientSession
) -> None:
    before = await replicas(cluster)
    sides = {k: v for k, v in before.items() if side_app(k[0])}
    assert sides and all(sides.values())
    await cli(cluster, "promote", "--address", cluster.head.address)
    assert tags(await many(session, cluster, 60, lambda i: {})) == {"y2": 60}

    async def zero() -> bool:
        now = await replicas(cluster, NOT_STOPPING)
        return not now["ab", "model-y"] and not now["chat", "gen-a"]

    # Serve may first replace gen-a's replica (STARTING, then RUNNING ~60 s) before it scales to zero
    await eventually(zero, "the base's model-y and gen-a at 0 replicas", timeout_s=300)
    after = await replicas(cluster)
    assert {k: v for k, v in after.items() if side_app(k[0])} == sides  # same replica, actor, pid
    unchanged = {k for k in before if not side_app(k[0]) and k not in {("ab", "model-y"), ("chat", "gen-a")}}
    assert {k: after[k] for k in unchanged} == {k: before[k] for k in unchanged}
    assert await asyncio.to_thread(chat, cluster, None, True) == ["a2", "a2"]


async def _stats(s: aiohttp.ClientSession, cluster: Cluster) -> dict[str, Any]:
    async with s.get(f"{cluster.http}/ab", headers={"x-servegraph-stats": cluster.stats_token}) as resp:
        assert resp.status == 200
        return dict(await resp.json())


async def test_a_broken_version_mirrored_at_20_percent_reaches_no_client_and_abort_removes_it(
    cluster: Cluster, session: aiohttp.ClientSession
) -> None:
    live = await replicas(cluster)
    await canary(cluster, BAD, Split(weight=0, mirror=20))
    answers = await many(session, cluster, 400, lambda i: {})
    assert tags(answers) == {"y2": 400}  # every client answer from the live version

    last: list[int] = []

    async def counted() -> dict[str, Any] | None:  # every client request counted, the copies unchanged for 2 s
        stats = await _stats(session, cluster)
        copies = stats["versions"].get("3", {}).get("mirror", {}).get("requests", 0)
        settled = stats["versions"]["2"]["clients"]["requests"] >= 400 and copies and last[-4:] == [copies] * 4
        last.append(copies)
        return stats if settled else None

    stats = await eventually(counted, "the routers' stats of the 400 requests")
    clients, copies = stats["versions"]["2"]["clients"], stats["versions"]["3"]["mirror"]
    assert (stats["live"], stats["canary"], clients["errors"]) == ("2", "3", 0)
    assert 40 <= copies["requests"] <= 120, copies  # ~20 % of 400, some dropped when busy
    assert copies["errors"] == copies["requests"] and set(copies["failed_nodes"]) == {"model-y"}
    assert "clients" not in stats["versions"]["3"]  # weight 0: no client served by it

    async def mirrored() -> bool:
        errors = scrape_metrics(cluster.head.metrics_port).get("ray_servegraph_request_errors_total", [])
        return metric_total(errors, graph_version="3", caller="mirror", node="front") == copies["errors"]

    await eventually(mirrored, "the copies' failures under caller mirror, graph_version 3")

    # Pinned: version 3's own switch (a copy) calls the base's model-x by name, and its broken model-y fails.
    pinned = {"x-servegraph-version": "3"}
    assert await ask(session, cluster, "/ab", {"model": "z"}, pinned) == (200, {"tag": "x1", "payload": {"model": "z"}})
    async with session.post(f"{cluster.http}/ab", json={"model": "y"}, headers=pinned) as resp:
        assert resp.status == 500

    await cli(cluster, "abort")  # the dashboard from $RAY_DASHBOARD_ADDRESS
    after = await replicas(cluster)
    assert not [k for k in after if side_app(k[0]) and k not in live]  # the canary's side application gone
    assert {k: after.get(k) for k, v in live.items() if v} == {k: v for k, v in live.items() if v}
    assert tags(await many(session, cluster, 20, lambda i: pinned)) == {"y2": 20}  # no canary: the pin is ignored
    await eventually(lambda: _gone(cluster), "the base's gen-a back at 0 replicas", timeout_s=300)


async def _gone(cluster: Cluster) -> bool:
    return not (await replicas(cluster, NOT_STOPPING))["chat", "gen-a"]


async def test_a_canary_back_to_version_1_promoted_leaves_exactly_what_up_deployed(
    cluster: Cluster, session: aiohttp.ClientSession
) -> None:
    """Version 1 copies nothing (it is the base); as a canary it scales the base's model-y and
    gen-a back up, and promoting it removes version 2's side applications: what runs is what
    `servegraph up` of version 1 deployed, and nothing of version 1 restarted on the way."""
    await cli(cluster, "canary", str(V1), "--weight", "50")
    assert set(tags(await many(session, cluster, 100, lambda i: {}))) == {"y1", "y2"}
    during = await replicas(cluster)
    assert during["ab", "model-y"] and during["chat", "gen-a"]
    await cli(cluster, "promote")
    after = await replicas(cluster)
    assert not [name for name, _ in after if side_app(name)]
    assert after == {k: v for k, v in during.items() if not side_app(k[0])}
    assert tags(await many(session, cluster, 40, lambda i: {})) == {"y1": 40}
    _, wanted = up.render(V1)
    async with RayDashboard(cluster.head.address, cluster.head.token) as dash:
        state = await dash.get_applications()
    assert {n: a.deployed_app_config for n, a in state.applications.items()} == {
        a["name"]: a for a in wanted["applications"]
    }
