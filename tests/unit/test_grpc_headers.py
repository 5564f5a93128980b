"""Over gRPC, headers are the call's metadata, as over HTTP they are the request's headers:
what a gateway in front of the graph sees, sets and strips. The request message's own
`headers` map is refused: read from the body, any caller picked a header switch's branch
(`x-auth-request-groups: admins`) past a gateway that strips that header.
(On a real Ray through Serve's gRPC proxy: tests/e2e/test_e2e_callers.py.)"""

from __future__ import annotations

from typing import Any

from grpc_context import GrpcContext
from test_runtime_routers import user

from servegraph.runtime.grpcwire import HEADERS_IN_MESSAGE
from servegraph.runtime.routers import SwitchRouter
from servegraph.v1 import service_pb2

GROUPS = "x-auth-request-groups"


def by_group() -> tuple[SwitchRouter, list[str]]:
    reached: list[str] = []

    def branch(name: str) -> Any:
        return lambda payload: reached.append(name) or name

    switch = SwitchRouter(
        "by-group", [("admins", user("admin", branch("admin")))], user("user", branch("user")), header=GROUPS
    )
    return switch, reached


async def test_a_header_switch_reads_the_calls_metadata() -> None:
    switch, reached = by_group()
    admin = await switch.Call(service_pb2.CallRequest(), grpc_context=GrpcContext({GROUPS: "admins"}))
    plain = await switch.Call(service_pb2.CallRequest(), grpc_context=GrpcContext())
    assert (admin.result.string_value, plain.result.string_value) == ("admin", "user")
    streamed = [
        r async for r in switch.Stream(service_pb2.StreamRequest(), grpc_context=GrpcContext({GROUPS: "admins"}))
    ]
    assert [r.item.string_value for r in streamed] == ["admin"] and reached == ["admin", "user", "admin"]


async def test_headers_in_the_message_are_refused_before_any_branch_is_chosen() -> None:
    switch, reached = by_group()
    context = GrpcContext()
    reply = await switch.Call(service_pb2.CallRequest(headers={GROUPS: "admins"}), grpc_context=context)
    assert (context.code.name, context.details, reply.error.message) == (
        "INVALID_ARGUMENT", HEADERS_IN_MESSAGE, HEADERS_IN_MESSAGE
    )  # fmt: skip
    assert "gRPC metadata" in HEADERS_IN_MESSAGE
    context = GrpcContext()
    [only] = [
        r async for r in switch.Stream(service_pb2.StreamRequest(headers={GROUPS: "admins"}), grpc_context=context)
    ]
    assert (context.code.name, only.error.message) == ("INVALID_ARGUMENT", HEADERS_IN_MESSAGE)
    assert reached == []


async def test_binary_metadata_is_no_header() -> None:
    switch, _ = by_group()
    reply = await switch.Call(service_pb2.CallRequest(), grpc_context=GrpcContext({f"{GROUPS}-bin": b"admins"}))
    assert reply.result.string_value == "user"
