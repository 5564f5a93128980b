"""The streaming sample through a ServeGraph under the real KubeRay: token streams over HTTP and
gRPC through KubeRay's serve Service, and an in-place update under a streaming load losing no
stream."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from google.protobuf import text_format
from node_support import deploy, figure, wait_ready, wait_rolled_out
from support import SAMPLES

from servegraph import grpc_client
from servegraph.render.serve_config import SERVE_GRPC_PORT
from servegraph.v1 import graph_pb2
from servegraph_testbed.node.routes import answer
from servegraph_testbed.node.stack import Stack
from servegraph_testbed.waiting import eventually

PROMPT = {"text": "the secret plan um works", "max_tokens": 5, "delay_s": 0.05}
# The filter drops "um" and masks "secret": 5 tokens in, 4 out.
EXPECTED = ["the", "******", "plan", "works"]


def streaming(version: str, redact: str = "secret") -> graph_pb2.Graph:
    """config/samples/streaming with a version and the filter's redacted word (a Serve-only change)."""
    graph = text_format.Parse((SAMPLES / "streaming.txtpb").read_text(), graph_pb2.Graph())
    graph.version = version
    redacted = graph.applications[0].nodes["filter"].deployment.kwargs["redact"].value.list_value
    del redacted.values[:]
    redacted.values.add().string_value = redact
    return graph


async def stream(url: str, payload: Any, headers: dict[str, str] | None = None) -> tuple[int, list[Any], float]:
    """(status, the items, seconds to the first item) of one streamed request."""
    timeout = aiohttp.ClientTimeout(total=30, sock_connect=5)
    started = time.monotonic()
    first = -1.0
    items: list[Any] = []
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(url, json=payload, headers=headers) as resp,
    ):
        if resp.status != 200:
            return resp.status, [await resp.text()], first
        async for line in resp.content:
            if line.strip():
                if first < 0:
                    first = time.monotonic() - started
                items.append(json.loads(line))
        return resp.status, items, first


@dataclass
class StreamLoad:
    """Streams back to back (one in flight), each checked whole: status 200, every token, no error item."""

    url: str
    results: list[tuple[float, bool, str]] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> StreamLoad:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task

    async def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                status, items, _ = await stream(self.url, PROMPT)
                tokens = [i.get("token") for i in items]
                whole = status == 200 and len(tokens) == 4 and not any("error" in i for i in items)
                self.results.append((started, whole, json.dumps(tokens if whole else items)[:300]))
            except (aiohttp.ClientError, TimeoutError) as e:
                self.results.append((started, False, repr(e)))

    @property
    def lost(self) -> list[tuple[float, bool, str]]:
        return [r for r in self.results if not r[1]]

    def tokens(self) -> list[str]:
        """The distinct answers of whole streams, in order of first appearance."""
        seen: list[str] = []
        for _, whole, text in self.results:
            if whole and text not in seen:
                seen.append(text)
        return seen


async def _until(check: Any, within: float, what: str) -> None:
    async def done() -> bool:
        return bool(check())

    await eventually(done, within=within, interval=0.25, what=what)


async def test_the_streaming_sample_streams_over_http_and_grpc_and_updates_in_place_losing_no_stream(
    stack: Stack, namespace: str
) -> None:
    registry_name = await deploy(stack, namespace, "streaming", streaming("1"))
    await wait_ready(stack, namespace, "streaming")
    url = stack.serve_url(namespace, "streaming", "/chat")
    await answer(url, {"text": "warm up", "max_tokens": 1})  # the first request after Ready may be lost (routes.py)

    # HTTP: newline-delimited JSON, each item as the generator yields it, the filter applied.
    status, items, first_s = await stream(url, PROMPT)
    assert status == 200
    assert [i["token"] for i in items] == EXPECTED
    assert {i["model"] for i in items} <= {"gen-a", "gen-b"}
    status, items, _ = await stream(url, PROMPT, {"x-model": "b"})
    assert {i["model"] for i in items} == {"gen-b"}
    figure(f"streaming sample over HTTP: first item {first_s * 1000:.0f} ms, 5 tokens at 50 ms each")

    # gRPC: the same graph through the same serve Service, on KubeRay's serve-grpc port.
    target = f"{stack.service_ip(namespace, 'streaming-serve-svc')}:{SERVE_GRPC_PORT}"
    streamed = await asyncio.to_thread(lambda: list(grpc_client.stream(target, "chat", PROMPT, {"x-model": "b"})))
    assert [i["token"] for i in streamed] == EXPECTED and {i["model"] for i in streamed} == {"gen-b"}
    whole = await asyncio.to_thread(grpc_client.call, target, "chat", PROMPT)
    assert [i["token"] for i in whole] == EXPECTED

    # A refused prompt fails before any token: an error status, not a stream.
    status, items, _ = await stream(url, {"text": "something forbidden"})
    assert status == 500, items

    # In place, under a streaming load: the filter now masks "plan" instead.
    cluster = stack.get("rayservice", namespace, "streaming")["status"]["activeServiceStatus"]["rayClusterName"]
    async with StreamLoad(url) as load:
        await _until(lambda: len(load.results) >= 5, 60, "5 streams from v1")
        published = time.monotonic()
        await stack.publish(registry_name, streaming("2", redact="plan").SerializeToString())
        await stack.post_published_event(registry_name)
        await _until(lambda: '"****"' in (load.tokens()[-1:] or [""])[0], 180, "v2's stream")
        took = time.monotonic() - published
        await asyncio.sleep(5)  # keep streaming after the switch
    figure(
        f"streaming in-place update: publish -> new stream {took:.1f} s; "
        f"{len(load.lost)} of {len(load.results)} streams lost"
    )
    assert load.lost == [], f"{len(load.lost)} of {len(load.results)} streams lost: {load.lost[:5]}"
    v2 = ["the", "secret", "****", "works"]
    answers = load.tokens()
    assert answers[0] == json.dumps(EXPECTED) and load.results[-1][2] == json.dumps(v2), answers
    # The filter is a transform, called once per item: a stream in flight while Serve swaps its
    # replicas may have items filtered by either version (docs/runtime.md), never anything else.
    for text in answers:
        assert all(t in (a, b) for t, a, b in zip(json.loads(text), EXPECTED, v2, strict=True)), text
    await wait_rolled_out(stack, namespace, "streaming", "2")
    now = stack.get("rayservice", namespace, "streaming")["status"]["activeServiceStatus"]["rayClusterName"]
    assert now == cluster, "a Serve-only change must not build a new Ray cluster"
