"""What one request may hold at the ingress: bytes, values, depth; refused naming the limit.

In process, with starlette's real Request and the real protobuf messages; the same
against a real Ray (its gRPC proxy, its HTTP proxy) is tests/e2e/test_e2e_limits.py.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from grpc_context import GrpcContext
from starlette.requests import Request
from support import SAMPLES
from test_runtime_routers import user
from test_runtime_streams import Gen, child

from servegraph.graph import load_graph
from servegraph.render import RayServiceOptions, render_rayservice
from servegraph.render.rayservice import PodOverrides
from servegraph.runtime import grpcwire
from servegraph.runtime.grpc_ingress import with_graph_service
from servegraph.runtime.payload import Limits, PayloadRefused, check, payload_from_body
from servegraph.runtime.routers import SequenceRouter
from servegraph.v1 import service_pb2

SMALL = Limits(max_bytes=1000, max_items=50, max_depth=4)


def chunked(body: bytes, headers: dict[str, str] | None = None, chunk: int = 100) -> tuple[Request, list[int]]:
    """A request whose body arrives in chunks, and the list of chunks the app pulled."""
    pulled: list[int] = []
    parts = [body[i : i + chunk] for i in range(0, len(body), chunk)] or [b""]

    async def receive() -> dict[str, Any]:
        i = len(pulled)
        pulled.append(i)
        return {"type": "http.request", "body": parts[i], "more_body": i + 1 < len(parts)}

    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {"type": "http", "method": "POST", "path": "/", "headers": raw, "query_string": b""}
    return Request(scope, receive), pulled


def echo_router(limits: Limits) -> SequenceRouter:
    router = SequenceRouter("seq", [user("a", lambda p: p)])
    router.limits = limits
    return router


def test_the_limits_come_from_the_replicas_environment() -> None:
    assert Limits.from_env({}) == Limits(max_bytes=4 * 1024 * 1024, max_items=100_000, max_depth=32)
    env = {
        "SERVEGRAPH_MAX_REQUEST_BYTES": "64",
        "SERVEGRAPH_MAX_PAYLOAD_ITEMS": " 7 ",
        "SERVEGRAPH_MAX_PAYLOAD_DEPTH": "9999",
    }
    assert Limits.from_env(env) == Limits(max_bytes=64, max_items=7, max_depth=500)
    assert Limits.from_env({"SERVEGRAPH_MAX_REQUEST_BYTES": "0", "SERVEGRAPH_MAX_PAYLOAD_ITEMS": "lots"}) == Limits()


async def test_an_http_body_over_the_limit_is_413_and_read_no_further() -> None:
    request, pulled = chunked(b"x" * 5000)
    response = await echo_router(SMALL)(request)
    assert response.status_code == 413
    assert json.loads(response.body) == {"error": "request over the limit of 1000 bytes (SERVEGRAPH_MAX_REQUEST_BYTES)"}
    assert len(pulled) == 11  # 1,100 bytes: one chunk past the limit, not the 50 sent


async def test_a_declared_length_over_the_limit_is_refused_unread() -> None:
    request, pulled = chunked(b"x" * 5000, {"content-length": "5000"})
    assert (await echo_router(SMALL)(request)).status_code == 413
    assert pulled == []


@pytest.mark.parametrize(
    ("body", "status", "error"),
    [
        (json.dumps([{}] * 51).encode(), 413, "payload over the limit of 50 values (SERVEGRAPH_MAX_PAYLOAD_ITEMS)"),
        (json.dumps({"a": list(range(30)), "b": list(range(30))}).encode(), 413, "over the limit of 50 values"),
        (b"[[[[[1]]]]]", 400, "payload nested deeper than 4 (SERVEGRAPH_MAX_PAYLOAD_DEPTH)"),
        (b"[" * 100_000 + b"]" * 100_000, 413, "request over the limit"),
    ],
    ids=["values", "values-across-containers", "depth", "bytes"],
)
async def test_a_payload_over_a_limit_is_refused_naming_it(body: bytes, status: int, error: str) -> None:
    response = await echo_router(SMALL)(chunked(body)[0])
    assert response.status_code == status
    assert error in json.loads(response.body)["error"]


async def test_deeper_than_the_interpreter_parses_is_400_not_a_crash() -> None:
    limits = Limits(max_bytes=1_000_000)
    response = await echo_router(limits)(chunked(b"[" * 100_000 + b"]" * 100_000)[0])
    assert (response.status_code, json.loads(response.body)) == (
        400,
        {"error": f"payload nested deeper than 32 ({Limits.ENV['max_depth']})"},
    )


async def test_a_payload_at_the_limits_is_served() -> None:
    body = json.dumps([[[1, 2]], *range(45)]).encode()  # 50 values, depth 3
    response = await echo_router(SMALL)(chunked(body)[0])
    assert (response.status_code, json.loads(response.body)) == (200, json.loads(body))
    assert payload_from_body(b"not json " * 100, SMALL) == "not json " * 100  # text counts its bytes only


def _call(payload: Any) -> service_pb2.CallRequest:
    return service_pb2.CallRequest(payload=grpcwire.to_value(payload))


@pytest.mark.parametrize(
    ("payload", "code", "details"),
    [
        ([{}] * 51, "RESOURCE_EXHAUSTED", "payload over the limit of 50 values (SERVEGRAPH_MAX_PAYLOAD_ITEMS)"),
        ([[[[[1]]]]], "INVALID_ARGUMENT", "payload nested deeper than 4 (SERVEGRAPH_MAX_PAYLOAD_DEPTH)"),
        (
            {"k": "x" * 1001},
            "RESOURCE_EXHAUSTED",
            "request over the limit of 1000 bytes (SERVEGRAPH_MAX_REQUEST_BYTES)",
        ),
    ],
    ids=["values", "depth", "bytes"],
)
async def test_a_grpc_payload_over_a_limit_gets_the_status_naming_it(payload: Any, code: str, details: str) -> None:
    router, context = echo_router(SMALL), GrpcContext()
    response = await router.Call(_call(payload), grpc_context=context)
    assert (context.code.name, context.details, response.error.message) == (code, details, details)
    context = GrpcContext()
    streamed = [
        item
        async for item in router.Stream(
            service_pb2.StreamRequest(payload=grpcwire.to_value(payload)), grpc_context=context
        )
    ]
    assert [s.error.message for s in streamed] == [details] and context.code.name == code


def test_a_million_empty_objects_are_refused_before_any_is_converted() -> None:
    """The issue's request: 4 MiB of empty objects, 2.9 s and 300 MiB to convert before."""
    request = service_pb2.CallRequest()
    values = request.payload.list_value.values
    for _ in range(1_000_000):
        values.add().struct_value.SetInParent()
    parsed = service_pb2.CallRequest.FromString(request.SerializeToString())
    start = time.perf_counter()
    with pytest.raises(PayloadRefused, match="over the limit of 100000 values"):
        grpcwire.unpack(parsed, Limits())
    assert time.perf_counter() - start < 0.05


def test_conversion_reads_a_value_as_the_json_it_stands_for() -> None:
    value = {"n": 3, "f": 2.5, "big": 2.0**60, "s": "t", "b": True, "z": None, "l": [1, {"k": []}]}
    assert grpcwire.from_value(grpcwire.to_value(value), Limits()) == value
    with pytest.raises(PayloadRefused, match="not a JSON number"):
        grpcwire.from_value(service_pb2.CallRequest(payload={"number_value": float("inf")}).payload)
    check(value, Limits(max_items=11, max_depth=4))  # eleven values; the empty list is four deep
    with pytest.raises(PayloadRefused, match="over the limit of 10 values"):
        check(value, Limits(max_items=10))
    with pytest.raises(PayloadRefused, match="deeper than 3"):
        check(value, Limits(max_depth=3))


def test_every_ray_container_refuses_grpc_messages_over_the_ingress_limit() -> None:
    """Ray Serve reads its proxies' gRPC message size only from its environment (2 GiB if unset)."""
    m = render_rayservice(load_graph(SAMPLES / "mini.pb"), RayServiceOptions(name="m"))
    cluster = m["spec"]["rayClusterConfig"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        env = group["template"]["spec"]["containers"][0]["env"]
        assert {"name": "RAY_SERVE_GRPC_MAX_MESSAGE_SIZE", "value": str(Limits().max_bytes)} in env
    own = ({"name": "RAY_SERVE_GRPC_MAX_MESSAGE_SIZE", "value": "67108864"}, {"name": "A", "value": "1"})
    raised = render_rayservice(load_graph(SAMPLES / "mini.pb"), RayServiceOptions(name="m", head=PodOverrides(env=own)))
    head = raised["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert head["env"] == list(own)  # the ServeGraph's own value replaces it, once


# -- a stream answered as one (issue 45, item 5) ---------------------------------------------


def streaming(gen: Gen, limits: Limits) -> SequenceRouter:
    router = SequenceRouter("seq", [child("gen", gen, True)], streams=True)
    router.limits = limits
    return router


async def stopped(router: SequenceRouter, gen: Gen) -> bool:
    """Whether the router cancelled its call of the generator, and the generator was closed."""
    handle = router.steps[0].handle.root
    if handle.closing is not None:
        await handle.closing
    return handle.cancelled == 1 and gen.closed == 1


@pytest.mark.parametrize(
    ("gen", "limits", "over"),
    [
        (Gen(count=10**9), Limits(max_items=100), "100 items (SERVEGRAPH_MAX_PAYLOAD_ITEMS)"),
        (Gen(count=10**9), Limits(max_bytes=1000), "1000 bytes (SERVEGRAPH_MAX_REQUEST_BYTES)"),
        (Gen(count=10**9, pause=0.05), Limits(max_collect_s=1), "1 s (SERVEGRAPH_MAX_COLLECT_SECONDS)"),
    ],
    ids=["items", "bytes", "time"],
)
async def test_call_on_an_endless_stream_is_cut_at_a_limit_and_the_generator_stopped(
    gen: Gen, limits: Limits, over: str
) -> None:
    context, router = GrpcContext(), streaming(gen, limits)
    started = time.monotonic()
    reply = await router.Call(service_pb2.CallRequest(payload={"string_value": "p"}), grpc_context=context)
    details = f"the stream is over the limit of {over} for one answer: call Stream to receive its items as they come"
    assert (context.code.name, context.details, reply.error.message) == ("RESOURCE_EXHAUSTED", details, details)
    assert await stopped(router, gen)  # not left generating for nobody
    assert time.monotonic() - started < 3


async def test_a_plain_handle_call_on_a_stream_is_bounded_too() -> None:
    gen = Gen(count=10**9)
    router = streaming(gen, Limits(max_items=100))
    with pytest.raises(PayloadRefused, match="over the limit of 100 items"):
        await router("p")
    assert await stopped(router, gen) and gen.produced <= 101
    assert await streaming(Gen(count=100), Limits(max_items=100))("p") == [{"i": i, "for": "p"} for i in range(100)]


async def test_a_generator_at_the_ingress_answers_call_within_the_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """User code at the ingress (grpc_ingress.py): its generator, sync or async, is bounded the same way."""
    monkeypatch.setenv("SERVEGRAPH_MAX_PAYLOAD_ITEMS", "10")
    closed: list[str] = []

    class Endless:
        def __call__(self, payload: Any) -> Any:
            try:
                yield from iter(int, 1)
            finally:
                closed.append("sync")

    instance = with_graph_service(Endless, "gen", takes_headers=False)()
    context = GrpcContext()
    reply = await instance.Call(service_pb2.CallRequest(), grpc_context=context)
    assert context.code.name == "RESOURCE_EXHAUSTED" and "10 items" in reply.error.message
    assert closed == ["sync"]
