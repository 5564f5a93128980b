"""The gRPC client and `servegraph call` against a real gRPC server speaking GraphService.

The server here is grpcio's, on a loopback port, answering the way Ray Serve's proxy
and a servegraph router do: the `application` metadata picks the application, an
unknown one is NOT_FOUND, a node's failure is the response's `error`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from servegraph import grpc_client
from servegraph.grpc_client import CallError, from_value, to_value
from servegraph.v1 import service_pb2, service_pb2_grpc

SERVEGRAPH = Path(sys.executable).with_name("servegraph")


class Graphs(service_pb2_grpc.GraphServiceServicer):  # type: ignore[misc]
    """Application "echo" answers the payload and headers; "broken" fails at node "model"."""

    def __init__(self) -> None:
        self.stream_stopped = threading.Event()

    def _app(self, context: Any) -> str:
        app = dict(context.invocation_metadata()).get("application", "")
        if app not in ("echo", "broken"):
            context.abort(grpc.StatusCode.NOT_FOUND, f"Application '{app}' not found.")
        return app

    def Call(self, request: Any, context: Any) -> Any:
        if self._app(context) == "broken":
            error = service_pb2.Error(message="boom", node="model", timed_out=True)
            return service_pb2.CallResponse(error=error)
        payload = from_value(request.payload)
        headers = {k: v for k, v in context.invocation_metadata() if k.startswith("x-")}  # gRPC adds its own
        return service_pb2.CallResponse(result=to_value({"payload": payload, "headers": headers}))

    def Stream(self, request: Any, context: Any) -> Iterator[Any]:
        app = self._app(context)
        count = int(from_value(request.payload)["count"])
        try:
            for i in range(count):
                if app == "broken" and i == 2:
                    yield service_pb2.StreamResponse(error=service_pb2.Error(message="lost the thread", node="gen"))
                    return
                yield service_pb2.StreamResponse(item=to_value({"i": i}))
        finally:
            self.stream_stopped.set()


@pytest.fixture(scope="module")
def graphs() -> Iterator[tuple[str, Graphs]]:
    servicer = Graphs()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service_pb2_grpc.add_GraphServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(grace=None).wait()


def test_values_round_trip_as_json_reads_them() -> None:
    payload = {"text": "a fine day", "n": 3, "ratio": 0.5, "tags": ["a", None, True], "big": 2**60}
    back = from_value(to_value(payload))
    assert back == {**payload, "big": float(2**60)}  # beyond 2**53 a double is not a whole int
    assert isinstance(back["n"], int) and isinstance(back["ratio"], float)
    assert from_value(to_value(None)) is None


def test_a_payload_json_cannot_say_is_refused() -> None:
    with pytest.raises(ValueError, match="not a JSON value"):
        to_value({"when": object()})


def test_call_answers_with_the_result_routed_by_the_application_metadata(graphs: tuple[str, Graphs]) -> None:
    target, _ = graphs
    answer = grpc_client.call(target, "echo", {"text": "hi", "n": 2}, {"x-mode": "fast"})
    assert answer == {"payload": {"text": "hi", "n": 2}, "headers": {"x-mode": "fast"}}


def test_a_node_failure_is_a_call_error_naming_the_node(graphs: tuple[str, Graphs]) -> None:
    target, _ = graphs
    with pytest.raises(CallError) as raised:
        grpc_client.call(target, "broken", {})
    assert str(raised.value) == 'node "model": boom'
    assert (raised.value.node, raised.value.timed_out, raised.value.code) == ("model", True, None)


def test_a_message_naming_its_node_is_not_prefixed_again() -> None:
    from servegraph.grpc_client import _graph_error

    named = _graph_error(service_pb2.Error(message='node "gen" failed: KeyError: 1', node="gen"))
    assert str(named) == 'node "gen" failed: KeyError: 1'
    assert str(_graph_error(service_pb2.Error())) == "failed"


def test_an_unknown_application_is_a_clear_grpc_error(graphs: tuple[str, Graphs]) -> None:
    target, _ = graphs
    with pytest.raises(CallError) as raised:
        grpc_client.call(target, "nope", {})
    assert raised.value.code == "NOT_FOUND"
    assert str(raised.value) == "gRPC NOT_FOUND calling application 'nope': Application 'nope' not found."


def test_a_traceback_in_the_details_is_cut_to_what_happened() -> None:
    from servegraph.grpc_client import _rpc_error

    class Failed:
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.INTERNAL

        def details(self) -> str:
            return (
                '\x1b[36mray::ServeReplica:plain:stamp\x1b[39m (pid=1)\n  File "replica.py", line 1\n'
                "ray.serve.exceptions.RayServeException: Tried to call a method 'Stream' that does not exist. "
                "Available methods: [].\n"
            )

    error = _rpc_error(Failed(), "plain")
    assert error.code == "INTERNAL"
    assert str(error) == (
        "gRPC INTERNAL calling application 'plain': ray.serve.exceptions.RayServeException: Tried to call a method "
        "'Stream' that does not exist. Available methods: []. (the application's ingress is a function deployment, "
        "which has no methods to add: GraphService needs a router or a class there)"
    )


def test_nothing_listening_is_unavailable() -> None:
    with pytest.raises(CallError) as raised:
        grpc_client.call("127.0.0.1:1", "echo", {}, timeout_s=5)
    assert raised.value.code == "UNAVAILABLE"


def test_stream_yields_items_then_the_error_that_ended_it(graphs: tuple[str, Graphs]) -> None:
    target, _ = graphs
    assert list(grpc_client.stream(target, "echo", {"count": 3})) == [{"i": 0}, {"i": 1}, {"i": 2}]
    got = []
    with pytest.raises(CallError, match=r'^node "gen": lost the thread$'):
        for item in grpc_client.stream(target, "broken", {"count": 5}):
            got.append(item)
    assert got == [{"i": 0}, {"i": 1}]


def test_stopping_early_cancels_the_stream(graphs: tuple[str, Graphs]) -> None:
    target, servicer = graphs
    servicer.stream_stopped.clear()
    items = grpc_client.stream(target, "echo", {"count": 10**9})
    assert next(items) == {"i": 0}
    items.close()  # the consumer walks away
    assert servicer.stream_stopped.wait(10), "the server kept generating for nobody"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SERVEGRAPH), "call", *args], capture_output=True, text=True, timeout=60, check=False)


def test_servegraph_call_prints_json_lines(graphs: tuple[str, Graphs]) -> None:
    target, _ = graphs
    out = _cli("--grpc", target, "--app", "echo", "--header", "X-Mode=fast", '{"text": "hi"}')
    assert out.returncode == 0, out.stderr
    assert [json.loads(line) for line in out.stdout.splitlines()] == [
        {"payload": {"text": "hi"}, "headers": {"x-mode": "fast"}}
    ]
    out = _cli("--grpc", target, "--app", "echo", "--stream", '{"count": 2}')
    assert out.returncode == 0, out.stderr
    assert out.stdout == '{"i": 0}\n{"i": 1}\n'


def test_servegraph_call_says_what_went_wrong_in_one_line(graphs: tuple[str, Graphs]) -> None:
    target, _ = graphs
    out = _cli("--grpc", target, "--app", "nope", "{}")
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == "servegraph call: gRPC NOT_FOUND calling application 'nope': Application 'nope' not found.\n"
    out = _cli("--grpc", target, "--app", "echo", "{not json")
    assert out.returncode == 2 and out.stderr.startswith("servegraph call: PAYLOAD_JSON is not JSON:")
    out = _cli("--grpc", target, "--app", "echo", "--header", "novalue", "{}")
    assert out.returncode == 2 and "--header 'novalue': write NAME=VALUE" in out.stderr
