"""What whoever reaches a graph's ports can and cannot make it do, on a real Ray 2.60.

The head runs with the environment the rendered RayService gives every Ray container
(Ray Serve reads its gRPC proxy's message size only from there), and `servegraph up`
starts Serve with GraphService, as on a fresh cluster (so this module has its own head,
as test_e2e_grpc.py has).
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import io
import json
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from e2e_apps import LEAKED
from e2e_support import GRAPHS, WORKER_PATH
from rayhead import RayHead, free_port, running_head

from servegraph import grpc_client
from servegraph.graph import load_graph
from servegraph.grpc_client import CallError
from servegraph.raydash import up
from servegraph.render import RayServiceOptions, render_rayservice
from servegraph.runtime.grpcwire import HEADERS_IN_MESSAGE
from servegraph.v1 import service_pb2, service_pb2_grpc

GRAPH = GRAPHS / "callers.txtpb"
MiB = 1024 * 1024


def rendered_env() -> dict[str, str]:
    """The environment the operator renders into the head's Ray container."""
    manifest = render_rayservice(load_graph(GRAPH), RayServiceOptions(name="callers"))
    container = manifest["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container.get("env", [])}


@dataclass(frozen=True)
class Served:
    grpc: str
    http: str
    logs: Path
    """Ray Serve's logs of the head: every replica's."""

    def replica_logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.logs.glob("replica_*.log")))


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with running_head(num_cpus=2, extra_env={"PYTHONPATH": WORKER_PATH, **rendered_env()}) as head:
        yield deploy(head)


def deploy(head: RayHead) -> Served:
    http_port, grpc_port = free_port(), free_port()
    out, err = io.StringIO(), io.StringIO()
    code = asyncio.run(
        up.up(GRAPH, address=head.address, token=head.token, timeout_s=300, http_port=http_port,
              grpc_port=grpc_port, out=out, err=err)
    )  # fmt: skip
    assert code == 0, err.getvalue()
    logs = head.temp_dir / "session_latest" / "logs" / "serve"
    return Served(grpc=f"127.0.0.1:{grpc_port}", http=f"http://127.0.0.1:{http_port}", logs=logs)


def post(url: str, body: bytes) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def post_early(url: str, body: bytes) -> tuple[int, Any]:
    """POST, reading the answer while the body is still being sent: a server that answers 413
    before reading the whole body closes the connection, and a client that reads only once it
    has sent everything (urllib) gets a reset instead of the answer."""
    parsed = urllib.parse.urlsplit(url)
    with socket.create_connection((parsed.hostname, parsed.port), timeout=60) as sock:
        head = f"POST {parsed.path} HTTP/1.1\r\nHost: {parsed.netloc}\r\nContent-Length: {len(body)}\r\n\r\n"
        sock.sendall(head.encode())

        def send() -> None:
            with contextlib.suppress(OSError):  # the server closed the connection: it has answered
                sock.sendall(body)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        response = http.client.HTTPResponse(sock)
        response.begin()
        answer = response.status, json.loads(response.read())
        sock.shutdown(socket.SHUT_RDWR)
        sender.join(timeout=60)
        return answer


def nested(depth: int) -> list[Any]:
    """Lists `depth` deep: `[[...[]...]]`."""
    value: list[Any] = []
    for _ in range(depth - 1):
        value = [value]
    return value


# -- payload limits (issue 45, item 4) --------------------------------------------------------


def test_the_rendered_environment_sets_rays_grpc_message_size() -> None:
    assert rendered_env()["RAY_SERVE_GRPC_MAX_MESSAGE_SIZE"] == str(4 * MiB)


def test_an_http_body_over_the_limit_is_413_naming_it(served: Served) -> None:
    big = json.dumps({"trail": [], "pad": "x" * (4 * MiB)}).encode()
    assert post_early(f"{served.http}/relay", big) == (
        413, {"error": "request over the limit of 4194304 bytes (SERVEGRAPH_MAX_REQUEST_BYTES)"}
    )  # fmt: skip
    many = json.dumps([{}] * 100_001).encode()  # 400 KB
    assert post(f"{served.http}/relay", many) == (
        413, {"error": "payload over the limit of 100000 values (SERVEGRAPH_MAX_PAYLOAD_ITEMS)"}
    )  # fmt: skip
    deep = json.dumps(nested(33)).encode()
    assert post(f"{served.http}/relay", deep) == (
        400,
        {"error": "payload nested deeper than 32 (SERVEGRAPH_MAX_PAYLOAD_DEPTH)"},
    )
    assert post(f"{served.http}/relay", b'{"trail": []}') == (200, {"trail": ["a"]})


def test_a_grpc_message_over_the_limit_is_refused_by_rays_proxy(served: Served) -> None:
    pad = "x" * (4 * MiB)
    with pytest.raises(CallError) as raised:
        grpc_client.call(served.grpc, "scale", {"x": 1, "pad": pad})  # the answer is 2: small
    assert raised.value.code == "RESOURCE_EXHAUSTED"
    assert "vs. 4194304" in str(raised.value), raised.value  # grpc's "larger than max (N vs. 4194304)"
    assert grpc_client.call(served.grpc, "scale", {"x": 1, "pad": pad[: 4 * MiB - 100]}) == 2


@pytest.mark.parametrize(
    ("payload", "code", "details"),
    [
        (
            [{}] * 200_000,
            "RESOURCE_EXHAUSTED",
            "payload over the limit of 100000 values (SERVEGRAPH_MAX_PAYLOAD_ITEMS)",
        ),
        (nested(33), "INVALID_ARGUMENT", "payload nested deeper than 32 (SERVEGRAPH_MAX_PAYLOAD_DEPTH)"),
    ],
    ids=["values", "depth"],
)
def test_a_grpc_payload_over_a_limit_gets_the_status_naming_it(
    served: Served, payload: Any, code: str, details: str
) -> None:
    for call in (grpc_client.call, lambda *a: list(grpc_client.stream(*a))):
        with pytest.raises(CallError) as raised:
            call(served.grpc, "relay", payload)
        assert (raised.value.code, str(raised.value)) == (code, f"gRPC {code} calling application 'relay': {details}")
    assert grpc_client.call(served.grpc, "relay", {"trail": []}) == {"trail": ["a"]}


# -- a unary Call on a stream (issue 45, item 5) ---------------------------------------------


def test_call_on_an_endless_stream_is_refused_at_the_item_limit_and_the_generator_stops(served: Served) -> None:
    with pytest.raises(CallError) as raised:
        grpc_client.call(served.grpc, "chat", {"count": 10**9}, timeout_s=60)
    assert (raised.value.code, str(raised.value)) == (
        "RESOURCE_EXHAUSTED",
        "gRPC RESOURCE_EXHAUSTED calling application 'chat': the stream is over the limit of 2000 items "
        "(SERVEGRAPH_MAX_PAYLOAD_ITEMS) for one answer: call Stream to receive its items as they come",
    )
    deadline = time.monotonic() + 30
    while (stats := grpc_client.call(served.grpc, "chat", {"stats": True})[0])["cancelled"] < 1:
        assert time.monotonic() < deadline, f"the generator was never cancelled: {stats}"
        time.sleep(0.2)
    produced = stats["produced"]
    time.sleep(1)
    assert grpc_client.call(served.grpc, "chat", {"stats": True})[0]["produced"] == produced  # it stopped
    assert grpc_client.call(served.grpc, "chat", {"count": 3}) == [{"tag": "g", "i": i} for i in range(3)]


# -- what a failure tells a caller (issue 45, item 6) ------------------------------------------


def wait_logged(served: Served, text: str) -> None:
    deadline = time.monotonic() + 30
    while text not in served.replica_logs():
        assert time.monotonic() < deadline, f"{text!r} never reached a replica's log"
        time.sleep(0.2)


def test_callers_get_the_node_and_the_errors_type_and_the_log_gets_the_message(served: Served) -> None:
    status, entry = post(f"{served.http}/leak", b"{}")
    assert (status, entry["db"]) == (200, {"error": 'node "db" failed: ConnectionError', "node": "db"})
    with pytest.raises(CallError) as raised:
        grpc_client.call(served.grpc, "fail", {})
    assert str(raised.value) == 'node "steps" failed: ConnectionError' and raised.value.code is None
    request = urllib.request.Request(f"{served.http}/drip", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        lines = [json.loads(line) for line in response.read().splitlines()]
    assert lines == [{"i": 0}, {"error": 'node "gen" failed: ConnectionError', "node": "gen", "timed_out": False}]
    with pytest.raises(CallError) as streamed:
        list(grpc_client.stream(served.grpc, "drip", {}))
    assert str(streamed.value) == 'node "gen" failed: ConnectionError'
    wait_logged(served, f'servegraph node "db" failed: ConnectionError: could not reach {LEAKED}')
    wait_logged(served, f'servegraph node "gen" failed: ConnectionError: could not reach {LEAKED}')


# -- where gRPC headers come from (issue 45, item 7) -------------------------------------------


def test_a_header_switch_reads_grpc_metadata_and_headers_in_the_message_are_refused(served: Served) -> None:
    groups = {"x-auth-request-groups": "admins"}
    assert grpc_client.call(served.grpc, "pick", {}, groups) == {"tag": "admin", "payload": {}}  # metadata
    assert grpc_client.call(served.grpc, "pick", {}) == {"tag": "user", "payload": {}}
    assert list(grpc_client.stream(served.grpc, "pick", {}, groups)) == [{"tag": "admin", "payload": {}}]
    # The message's own map, which no gateway reads or strips: refused, not routed.
    with grpc.insecure_channel(served.grpc) as channel:
        stub = service_pb2_grpc.GraphServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.Call(service_pb2.CallRequest(headers=groups), metadata=(("application", "pick"),), timeout=60)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.details() == HEADERS_IN_MESSAGE
