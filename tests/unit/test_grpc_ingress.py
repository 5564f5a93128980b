"""User code at the ingress answers GraphService through the builder's subclass, and HTTP as before.
(On a real Ray through Serve's gRPC proxy: tests/e2e/test_e2e_grpc.py.)"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncGenerator, Iterator
from typing import Any

from grpc_context import GrpcContext

from servegraph.examples import Echo, TokenGenerator
from servegraph.runtime.builder import build, takes_headers
from servegraph.runtime.grpc_ingress import with_graph_service
from servegraph.runtime.serve_internals import bound
from servegraph.v1 import service_pb2


def call_request(payload: Any) -> service_pb2.CallRequest:
    req = service_pb2.CallRequest()
    req.payload.string_value = payload
    return req


def stream_request(payload: str) -> service_pb2.StreamRequest:
    req = service_pb2.StreamRequest()
    req.payload.string_value = payload
    return req


async def test_a_class_gets_call_and_stream_and_keeps_its_http_behaviour() -> None:
    served = with_graph_service(Echo, "echo", takes_headers(Echo))
    assert issubclass(served, Echo) and served is not Echo
    assert served.__call__ is Echo.__call__  # HTTP goes where it went
    reply = await served("t").Call(call_request("hi"), grpc_context=GrpcContext({"x-id": "1"}))
    assert reply.result.struct_value["payload"] == "hi"
    assert reply.result.struct_value["headers"]["x-id"] == "1"


async def test_a_generator_class_streams_over_stream_and_lists_over_call() -> None:
    served = with_graph_service(TokenGenerator, "gen", False)
    tokens = [r.item.struct_value["token"] async for r in served(max_tokens=3).Stream(stream_request("a b"))]
    assert tokens == ["a", "b", "a"]
    reply = await served(max_tokens=2).Call(call_request("a b"))
    assert [v.struct_value["token"] for v in reply.result.list_value.values] == ["a", "b"]


async def test_a_failure_is_the_error_field_naming_the_node() -> None:
    class Broken:
        def __call__(self, payload: Any) -> Any:
            raise KeyError("x")

    reply = await with_graph_service(Broken, "broken", False)().Call(call_request("p"))
    assert reply.error == service_pb2.Error(message='node "broken" failed: KeyError', node="broken")
    [last] = [r async for r in with_graph_service(Broken, "broken", False)().Stream(stream_request("p"))]
    assert last.error.node == "broken"


def test_a_class_with_its_own_call_is_left_alone() -> None:
    class Own:
        def Call(self, request: Any) -> Any:
            return request

    assert with_graph_service(Own, "own", False) is Own


async def test_functions_of_every_kind_become_classes_called_exactly_as_before() -> None:
    def plain(payload: Any) -> Any:
        return {"plain": payload}

    async def coro(payload: Any, headers: dict[str, str] | None = None) -> Any:
        return {"coro": payload, "headers": headers}

    def gen(payload: Any) -> Iterator[Any]:
        yield from (payload, payload)

    async def agen(payload: Any) -> AsyncGenerator[Any, None]:
        yield payload

    assert with_graph_service(plain, "n", False)()("p") == {"plain": "p"}
    coro_cls = with_graph_service(coro, "n", True)
    assert inspect.iscoroutinefunction(coro_cls.__call__)
    assert takes_headers(coro_cls)  # the signature is the function's
    assert await coro_cls()("p", headers={"a": "1"}) == {"coro": "p", "headers": {"a": "1"}}
    assert list(with_graph_service(gen, "n", False)()("p")) == ["p", "p"]
    assert [x async for x in with_graph_service(agen, "n", False)()("p")] == ["p"]
    reply = await with_graph_service(gen, "n", False)().Call(call_request("p"))
    assert [v.string_value for v in reply.result.list_value.values] == ["p", "p"]


def test_only_the_ingress_is_wrapped() -> None:
    app = build(
        {
            "ingress": "seq",
            "nodes": [
                {"id": "e", "deployment": {"import_path": "servegraph.examples:Echo"}},
                {"id": "seq", "sequence": {"steps": ["e"]}},
            ],
        }
    )
    (step,) = bound(app).init_args[1]
    assert bound(step.handle).func_or_class is Echo
    user_ingress = build(
        {"ingress": "e", "nodes": [{"id": "e", "deployment": {"import_path": "servegraph.examples:Echo"}}]}
    )
    wrapped = bound(user_ingress).func_or_class
    assert wrapped is not Echo and issubclass(wrapped, Echo) and hasattr(wrapped, "Call")
    assert asyncio.iscoroutinefunction(wrapped.Stream) is False and inspect.isasyncgenfunction(wrapped.Stream)
