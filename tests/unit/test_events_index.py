"""A "graph published" event reaches the ServeGraphs naming its URL through the cache's index,
which follows every ServeGraph's spec as it changes and goes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp import web
from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.bindings.http import to_binary_event
from cloudevents.core.v1.event import CloudEvent

from servegraph.names import REFRESH_ANNOTATION
from servegraph.operator.cache import WatchCache
from servegraph.operator.run.events_endpoint import events_app


def body(name: str, url: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": "1", "labels": dict(labels or {})}
    return {"metadata": meta, "spec": {"source": {"url": url}}}


def test_the_index_follows_each_servegraphs_url_and_empties_as_they_go() -> None:
    cache = WatchCache()
    for i in range(300):
        cache.put_servegraph(body(f"sg-{i}", f"https://r/g{i % 3}"))
    assert [h["metadata"]["name"] for h in cache.heads("https://r/g1")][:2] == ["sg-1", "sg-10"]
    assert len(cache.heads("https://r/g1")) == 100 and cache.heads("https://r/none") == []

    cache.put_servegraph(body("sg-1", "https://r/moved"))  # its spec now names another graph
    assert ("ns", "sg-1") not in {
        (h["metadata"]["namespace"], h["metadata"]["name"]) for h in cache.heads("https://r/g1")
    }
    assert [h["metadata"]["name"] for h in cache.heads("https://r/moved")] == ["sg-1"]

    # The operator's own status write keeps the ServeGraph where it is in the index.
    written = {**body("sg-4", "https://r/g1"), "status": {"phase": "x"}}
    written["metadata"] = {**written["metadata"], "resourceVersion": "2"}
    cache.put_status(("ns", "sg-4"), "uid-sg-4", {"phase": "x"}, written)
    assert len(cache.heads("https://r/g1")) == 99

    for i in range(300):
        cache.forget_servegraph(("ns", f"sg-{i}"))
    assert cache.sizes()["urls"] == 0 and cache.heads() == []


async def test_an_event_annotates_only_the_servegraphs_naming_its_url_or_matching_its_selector() -> None:
    cache = WatchCache()
    for i in range(1000):
        cache.put_servegraph(body(f"sg-{i}", f"https://r/g{i % 250}", {"team": "a" if i < 10 else "b"}))
    cache.put_servegraph(body("sg-0", "https://r/elsewhere", {"team": "a"}))  # moved away from g0
    asked: list[str | None] = []
    annotated: list[tuple[str, str, str]] = []

    def servegraphs(url: str | None) -> list[dict[str, Any]]:
        asked.append(url)
        return cache.heads(url)

    async def annotate(namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        annotated.append((namespace, name, annotations[REFRESH_ANNOTATION]))

    async def token(_: bool) -> str:
        return "secret-token"

    runner = web.AppRunner(events_app(token, servegraphs, annotate), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as session:

            async def post(event: BaseCloudEvent) -> Any:
                message = to_binary_event(event)
                headers = {**message.headers, "Authorization": "Bearer secret-token"}
                async with session.post(f"http://127.0.0.1:{port}/v1/events", headers=headers, data=message.body) as r:
                    assert r.status == 202, await r.text()
                    return await r.json()

            base = {"type": "io.servegraph.graph.published", "source": "https://r"}
            answer = await post(CloudEvent(attributes={**base, "id": "e1", "subject": "https://r/g0"}))
            assert answer["refreshed"] == sorted(f"ns/sg-{i}" for i in range(250, 1000, 250))
            assert asked == ["https://r/g0"], "the event's URL is looked up, not every ServeGraph read"
            assert {a[2] for a in annotated} == {"e1"}

            annotated.clear()
            answer = await post(CloudEvent(attributes={**base, "id": "e2"}, data={"labelSelector": "team=a"}))
            assert answer["refreshed"] == sorted(f"ns/sg-{i}" for i in range(10))
            assert asked[-1] is None and len(annotated) == 10
    finally:
        await runner.cleanup()
