"""A caller learns which node failed and the error's type; the message goes to the replica's log.

An exception's text is whatever user code put there: here a connection string with its
password, the issue's example. Every way a failure reaches a caller is tried — gRPC `Call`
and `Stream`, HTTP's mid-stream error item (NDJSON and Server-Sent Events), an optional
ensemble member's entry over HTTP, user code at the ingress — and in each the password
must be absent from the answer and present in the log. (On a real Ray:
tests/e2e/test_e2e_callers.py.)
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import pytest
from test_runtime_calls import user
from test_runtime_routers import http_request
from test_runtime_streams import body_of, child

from servegraph.dag.model import Call
from servegraph.runtime.grpc_ingress import with_graph_service
from servegraph.runtime.routers import EnsembleRouter, SequenceRouter
from servegraph.v1 import service_pb2

SECRET = "hunter2"
MESSAGE = f"could not reach postgres://app:{SECRET}@db:5432/orders"


def leak(_: Any) -> Any:
    raise ConnectionError(MESSAGE)


class LeakingStream:
    async def __call__(self, payload: Any) -> AsyncGenerator[Any, None]:
        yield {"i": 0}
        raise ConnectionError(MESSAGE)


@pytest.fixture
def log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """The replica's log: Ray Serve's logger, which Ray keeps from propagating to the root."""
    serve = logging.getLogger("ray.serve")
    serve.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        serve.removeHandler(caplog.handler)


def logged_once(log: pytest.LogCaptureFixture, node: str) -> None:
    lines = [r.getMessage() for r in log.records if SECRET in r.getMessage()]
    assert lines == [f'servegraph node "{node}" failed: ConnectionError: {MESSAGE}']


async def test_grpc_call_and_stream_name_the_node_and_type_only(log: pytest.LogCaptureFixture) -> None:
    seq = SequenceRouter("seq", [user("db", leak)])
    reply = await seq.Call(service_pb2.CallRequest())
    assert reply.error == service_pb2.Error(message='node "seq" failed: ConnectionError', node="seq")
    logged_once(log, "seq")
    log.clear()
    [last] = [r async for r in seq.Stream(service_pb2.StreamRequest())]
    assert last.error.message == 'node "seq" failed: ConnectionError'
    logged_once(log, "seq")


@pytest.mark.parametrize("accept", [b"application/json", b"text/event-stream"])
async def test_a_mid_stream_error_item_names_the_node_and_type_only(
    log: pytest.LogCaptureFixture, accept: bytes
) -> None:
    seq = SequenceRouter("seq", [child("gen", LeakingStream(), True)], streams=True)
    chunks = await body_of(await seq(http_request(b"{}", {"accept": accept.decode()})))
    assert SECRET not in "".join(chunks)
    last = json.loads(chunks[-1].removeprefix("event: error\ndata: "))
    assert last == {"error": 'node "gen" failed: ConnectionError', "node": "gen", "timed_out": False}
    logged_once(log, "gen")  # by the router that called it, where the message arrived


async def test_an_optional_members_entry_names_the_node_and_type_only(log: pytest.LogCaptureFixture) -> None:
    ensemble = EnsembleRouter("both", [user("ok", lambda p: "ok"), user("db", leak, Call(optional=True))])
    response = await ensemble(http_request(b"{}"))
    assert json.loads(response.body) == {"ok": "ok", "db": {"error": 'node "db" failed: ConnectionError', "node": "db"}}
    logged_once(log, "db")


async def test_user_code_at_the_ingress_answers_grpc_with_the_type_only(log: pytest.LogCaptureFixture) -> None:
    class Leaky:
        def __call__(self, payload: Any) -> Any:
            leak(payload)

    reply = await with_graph_service(Leaky, "leaky", False)().Call(service_pb2.CallRequest())
    assert reply.error.message == 'node "leaky" failed: ConnectionError'
    logged_once(log, "leaky")
