"""Streaming routers with in-process handles: items in order, transforms, timeouts, retries,
error items, cancellation, NDJSON/SSE and GraphService. (On a real Ray, with a real HTTP
client and a real disconnect: tests/e2e/test_e2e_streaming.py.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import StreamingResponse

from servegraph.dag.model import Call
from servegraph.examples import Guard, StreamFilter, TokenGenerator
from servegraph.runtime import wire
from servegraph.runtime.calls import NodeFailed, NodeTimeout
from servegraph.runtime.routers import Child, SequenceRouter, SplitterRouter, SwitchRouter
from servegraph.v1 import service_pb2


class Handle:
    """Stands in for a DeploymentHandle, with `.options(stream=True)` giving a generator response."""

    def __init__(self, target: Any, method: str = "__call__", stream: bool = False) -> None:
        self.target, self.method, self.stream = target, method, stream
        self.opened = 0
        self.cancelled = 0
        self.root: Handle = self
        self.closing: asyncio.Future[None] | None = None
        """The generator's close, started when a stream of it is cancelled."""
        self.was_cancelled = asyncio.Event()

    def options(self, *, method_name: str | None = None, stream: bool = False) -> Handle:
        other = Handle(self.target, method_name or self.method, stream)
        other.root = self.root
        return other

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        fn = self.target if self.method == "__call__" else getattr(self.target, self.method)
        root = self.root
        if not self.stream:
            result = fn(*args, **kwargs)
            assert not hasattr(result, "__anext__"), "a generator called without stream=True"
            return asyncio.ensure_future(result) if asyncio.iscoroutine(result) else _done(result)
        root.opened += 1
        gen = fn(*args, **kwargs)

        class Stream:
            async def __anext__(self) -> Any:
                return await gen.__anext__()

            def cancel(self) -> None:
                root.cancelled += 1
                root.closing = asyncio.ensure_future(gen.aclose())
                root.was_cancelled.set()

        return Stream()


def _done(value: Any) -> asyncio.Future[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


class Gen:
    """A generator deployment: `count` items, `pause` between them; may fail at `fail_at`."""

    def __init__(self, count: int = 3, pause: float = 0.0, fail_at: int | None = None, first_delay: float = 0.0):
        self.count, self.pause, self.fail_at, self.first_delay = count, pause, fail_at, first_delay
        self.produced = 0
        self.closed = 0

    async def __call__(self, payload: Any) -> AsyncGenerator[Any, None]:
        try:
            if self.first_delay:
                await asyncio.sleep(self.first_delay)
            for i in range(self.count):
                if i and self.pause:
                    await asyncio.sleep(self.pause)
                if i == self.fail_at:
                    raise ValueError(f"boom at {i}")
                self.produced += 1
                yield {"i": i, "for": payload}
        finally:
            self.closed += 1


async def closed(child: Child) -> None:
    """Until the generator behind `child`'s handle is closed: its stream was cancelled once,
    and the close that cancelling started has ended."""
    root = child.handle.root
    await asyncio.wait_for(root.was_cancelled.wait(), timeout=5)
    assert root.cancelled == 1 and root.closing is not None
    await asyncio.wait_for(root.closing, timeout=5)


def child(node_id: str, target: Any, streams: bool, call: Call | None = None, router: bool = False) -> Child:
    return Child(node_id, Handle(target), router, call or Call(), False, streams)


async def collect(router: Any, payload: Any = "p", headers: dict[str, str] | None = None) -> list[Any]:
    return [item async for item in router.stream(payload, headers or {})]


def request(body: bytes = b'"p"', headers: list[tuple[bytes, bytes]] | None = None) -> Request:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers or []}, receive)


async def body_of(response: Any) -> list[str]:
    assert isinstance(response, StreamingResponse)
    return [chunk.decode() async for chunk in response.body_iterator]  # type: ignore[union-attr]


async def test_a_sequence_feeds_unary_steps_into_the_generator_and_transforms_each_item() -> None:
    upper = lambda p: str(p).upper()  # noqa: E731
    gen = Gen(count=3)
    mark = lambda item: {**item, "marked": True}  # noqa: E731

    async def twice(item: Any) -> AsyncGenerator[Any, None]:
        if item["i"] != 1:  # drops item 1, doubles the rest
            yield item
            yield item

    seq = SequenceRouter(
        "seq",
        [child("up", upper, False), child("gen", gen, True), child("twice", twice, True), child("mark", mark, False)],
        streams=True,
    )
    items = await collect(seq, "p")
    assert [(x["i"], x["for"], x["marked"]) for x in items] == [(0, "P", True)] * 2 + [(2, "P", True)] * 2


async def test_the_first_item_leaves_before_the_generator_ends() -> None:
    seq = SequenceRouter("seq", [child("gen", Gen(count=3, pause=0.3), True)], streams=True)
    loop = asyncio.get_running_loop()
    start = loop.time()
    stream = seq.stream("p", {})
    await anext(stream)
    first = loop.time() - start
    rest = [x async for x in stream]
    total = loop.time() - start
    assert len(rest) == 2 and first < 0.2 and total >= 0.6


async def test_http_answers_ndjson_or_sse_as_asked() -> None:
    seq = SequenceRouter("seq", [child("gen", Gen(count=2), True)], streams=True)
    lines = await body_of(await seq(request()))
    assert [json.loads(x) for x in lines] == [{"i": 0, "for": "p"}, {"i": 1, "for": "p"}]
    assert all(x.endswith("\n") for x in lines)
    events = await body_of(await seq(request(headers=[(b"accept", b"text/event-stream")])))
    assert events == ['data: {"i": 0, "for": "p"}\n\n', 'data: {"i": 1, "for": "p"}\n\n']
    response = await seq(request(headers=[(b"accept", b"text/event-stream")]))
    assert response.media_type == wire.SSE


async def test_a_failure_mid_stream_ends_it_with_an_error_item_naming_the_node() -> None:
    seq = SequenceRouter("seq", [child("gen", Gen(count=3, fail_at=1), True)], streams=True)
    lines = [json.loads(x) for x in await body_of(await seq(request()))]
    assert lines[0] == {"i": 0, "for": "p"}
    assert lines[1] == {"error": 'node "gen" failed: ValueError', "node": "gen", "timed_out": False}
    assert len(lines) == 2
    sse = await body_of(await seq(request(headers=[(b"accept", b"text/event-stream")])))
    assert sse[-1].startswith("event: error\ndata: ")


async def test_a_stream_that_fails_before_its_first_item_fails_the_request() -> None:
    seq = SequenceRouter("seq", [child("gen", Gen(count=3, fail_at=0), True)], streams=True)
    with pytest.raises(NodeFailed, match='node "gen" failed: ValueError'):
        await seq(request())


async def test_the_edge_timeout_bounds_the_first_item_and_each_gap() -> None:
    slow_first = SequenceRouter("seq", [child("gen", Gen(first_delay=1.0), True, Call(timeout_s=0.1))], streams=True)
    response = await slow_first(request())
    assert response.status_code == 504
    assert json.loads(response.body) == {"error": 'node "gen" timed out after 0.1 s', "node": "gen", "timed_out": True}

    gen = Gen(count=3, pause=1.0)
    gapped = child("gen", gen, True, Call(timeout_s=0.1))
    slow_gap = SequenceRouter("seq", [gapped], streams=True)
    lines = [json.loads(x) for x in await body_of(await slow_gap(request()))]
    assert lines == [
        {"i": 0, "for": "p"},
        {"error": 'node "gen" timed out after 0.1 s', "node": "gen", "timed_out": True},
    ]
    await closed(gapped)
    assert gen.closed == 1  # the generator cut by the timeout was closed, not left running


class Flaky(Gen):
    """A generator deployment whose first call fails before any item (a cold start)."""

    async def __call__(self, payload: Any) -> AsyncGenerator[Any, None]:
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls == 1:
            raise RuntimeError("cold start")
        async for item in super().__call__(payload):
            yield item


async def test_a_stream_is_retried_before_its_first_item_only() -> None:
    flaky = Flaky(count=2)
    seq = SequenceRouter("seq", [child("gen", flaky, True, Call(retries=1))], streams=True)
    assert [x["i"] for x in await collect(seq)] == [0, 1]
    assert flaky.calls == 2

    midway = Gen(count=3, fail_at=1)
    seq = SequenceRouter("seq", [child("gen", midway, True, Call(retries=3))], streams=True)
    with pytest.raises(NodeFailed):
        await collect(seq)
    assert midway.produced == 1  # not restarted after its first item went downstream


async def test_a_consumer_that_stops_early_cancels_the_upstream_generator() -> None:
    gen = Gen(count=100, pause=0.01)
    handle_child = child("gen", gen, True)
    seq = SequenceRouter("seq", [handle_child], streams=True)
    body = (await seq(request())).body_iterator
    assert json.loads(await anext(body)) == {"i": 0, "for": "p"}
    await body.aclose()  # the client went away
    await closed(handle_child)
    assert gen.closed == 1 and gen.produced < 5


async def test_switch_and_splitter_pass_the_chosen_stream_through() -> None:
    a, b = Gen(count=1), Gen(count=2)
    switch = SwitchRouter("sw", [("b", child("b", b, True))], child("a", a, True), header="x-model", streams=True)
    assert len(await collect(switch, "p", {"x-model": "b"})) == 2
    assert len(await collect(switch, "p", {})) == 1
    split = SplitterRouter("sp", [(child("b", b, True), 100)], streams=True)
    assert len(await collect(split)) == 2


async def test_a_streaming_router_called_by_a_router_above_it_streams_through() -> None:
    inner = SequenceRouter("inner", [child("gen", Gen(count=2), True)], streams=True)
    outer = SwitchRouter("sw", [], Child("inner", Handle(inner), True, Call(), False, True), field="k", streams=True)
    assert [x["i"] for x in await collect(outer)] == [0, 1]


async def test_a_plain_handle_call_gets_the_whole_stream_as_a_list() -> None:
    seq = SequenceRouter("seq", [child("gen", Gen(count=2), True)], streams=True)
    assert await seq("p") == [{"i": 0, "for": "p"}, {"i": 1, "for": "p"}]


async def test_graphservice_call_and_stream() -> None:
    seq = SequenceRouter("seq", [child("gen", Gen(count=2), True)], streams=True)
    req = service_pb2.CallRequest()
    req.payload.string_value = "p"
    reply = await seq.Call(req)
    assert [dict(v.struct_value) for v in reply.result.list_value.values] == [
        {"i": 0.0, "for": "p"},
        {"i": 1.0, "for": "p"},
    ]

    stream_req = service_pb2.StreamRequest()
    stream_req.payload.string_value = "p"
    replies = [r async for r in seq.Stream(stream_req)]
    assert [r.item.struct_value["i"] for r in replies] == [0, 1]

    failing = SequenceRouter("seq", [child("gen", Gen(count=3, fail_at=1), True)], streams=True)
    replies = [r async for r in failing.Stream(stream_req)]
    assert replies[-1].error == service_pb2.Error(message='node "gen" failed: ValueError', node="gen")
    assert len(replies) == 2
    call_reply = await failing.Call(req)
    assert call_reply.HasField("error") and not call_reply.HasField("result")


async def test_graphservice_on_a_unary_graph_answers_one_item() -> None:
    seq = SequenceRouter("seq", [child("up", lambda p: str(p).upper(), False)])
    req = service_pb2.StreamRequest()
    req.payload.string_value = "p"
    assert [r.item.string_value async for r in seq.Stream(req)] == ["P"]


def test_a_timeout_and_a_failure_survive_pickling_between_replicas() -> None:
    import pickle

    assert (
        pickle.loads(pickle.dumps(NodeFailed("gen", "ValueError: x"))).body()
        == NodeFailed("gen", "ValueError: x").body()
    )
    assert (
        str(pickle.loads(pickle.dumps(NodeTimeout("gen", 1.0, 2))))
        == 'node "gen" timed out after 1 s on each of 2 attempts'
    )


# -- the examples the streaming sample uses -----------------------------------------------


async def test_token_generator_is_deterministic_and_paced() -> None:
    gen = TokenGenerator(tag="a", max_tokens=5)
    items = [x async for x in gen({"text": "hello big world"})]
    assert [x["token"] for x in items] == ["hello", "big", "world", "hello", "big"]
    assert [x["index"] for x in items] == list(range(5)) and {x["model"] for x in items} == {"a"}
    assert [x async for x in gen({"text": "x", "max_tokens": 0})] == []
    with pytest.raises(ValueError, match="max_tokens must be an integer"):
        [x async for x in gen({"text": "x", "max_tokens": -1})]


async def test_stream_filter_drops_and_redacts() -> None:
    f = StreamFilter(drop=["um"], redact=["secret"])
    assert [x async for x in f({"token": "Um"})] == []
    assert [x async for x in f({"token": "secret"})] == [{"token": "******", "redacted": True}]
    assert [x async for x in f({"token": "ok"})] == [{"token": "ok"}]


async def test_guard_refuses_a_blocked_prompt_naming_the_word() -> None:
    guard = Guard(blocked=["forbidden"])
    assert await guard({"text": "hi there", "max_tokens": 2}) == {"text": "hi there", "max_tokens": 2}
    with pytest.raises(ValueError, match="blocked word"):
        await guard("this is Forbidden")


async def test_whole_numbers_reach_user_code_as_ints_over_grpc() -> None:
    """Value's numbers are doubles: a payload's `5` must still be `range()`-able, as over HTTP."""
    seen: list[Any] = []
    seq = SequenceRouter("seq", [child("n", lambda p: seen.append(p) or p, False)])
    req = service_pb2.CallRequest()
    req.payload.struct_value.update({"max_tokens": 5, "t": 0.5, "xs": [1, 2.5]})
    reply = await seq.Call(req)
    assert seen == [{"max_tokens": 5, "t": 0.5, "xs": [1, 2.5]}]
    assert type(seen[0]["max_tokens"]) is int and type(seen[0]["xs"][0]) is int
    assert not reply.HasField("error")
