"""gRPC for every graph on a real Ray: `servegraph up` starts Serve with GraphService and
the routers at the ingresses answer it, unary and streaming, through Ray Serve's gRPC proxy.

This module runs its own Ray head: Serve takes its gRPC options only when it starts, and
the session head's Serve is started without them (conftest's `start_serve`). Here
`servegraph up` is what starts Serve, as on a fresh cluster.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e_support import GRAPHS, WORKER_PATH
from rayhead import RayHead, free_port, running_head

from servegraph import grpc_client
from servegraph.grpc_client import CallError
from servegraph.raydash import up

SERVEGRAPH = Path(sys.executable).with_name("servegraph")


@dataclass(frozen=True)
class Served:
    grpc: str
    http: str
    progress: str
    """What `servegraph up` printed on stderr."""


@pytest.fixture(scope="module")
def grpc_head() -> Iterator[RayHead]:
    with running_head(num_cpus=2, extra_env={"PYTHONPATH": WORKER_PATH}) as head:
        yield head


@pytest.fixture(scope="module")
def served(grpc_head: RayHead) -> Served:
    http_port, grpc_port = free_port(), free_port()
    out, err = io.StringIO(), io.StringIO()
    code = asyncio.run(
        up.up(
            GRAPHS / "grpc.txtpb",
            address=grpc_head.address,
            token=grpc_head.token,
            timeout_s=300,
            http_port=http_port,
            grpc_port=grpc_port,
            out=out,
            err=err,
        )
    )
    assert code == 0, err.getvalue()
    return Served(grpc=f"127.0.0.1:{grpc_port}", http=f"http://127.0.0.1:{http_port}", progress=err.getvalue())


def test_up_prints_the_call_line_and_it_answers(served: Served) -> None:
    (line,) = re.findall(r"^gRPC: (servegraph call .*)$", served.progress, re.MULTILINE)
    assert line == f"servegraph call --grpc {served.grpc} --app relay PAYLOAD_JSON"
    command = [str(SERVEGRAPH), *line.split()[1:-1], '{"trail": ["client"]}']
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == '{"trail": ["client", "a", "b"]}\n'


def test_call_answers_what_http_answers(served: Served) -> None:
    payload = {"x": 7, "trail": []}
    over_grpc = grpc_client.call(served.grpc, "relay", payload)
    assert over_grpc == {"x": 7, "trail": ["a", "b"]}
    request = urllib.request.Request(f"{served.http}/relay", data=json.dumps(payload).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        assert json.loads(response.read()) == over_grpc


def test_headers_reach_the_graph_over_grpc(served: Served) -> None:
    assert grpc_client.call(served.grpc, "pick", {}, {"x-kind": "second"}) == {"trail": ["second"]}
    assert grpc_client.call(served.grpc, "pick", {}, {"X-Kind": "second"}) == {"trail": ["second"]}
    assert grpc_client.call(served.grpc, "pick", {}) == {"trail": ["first"]}


def test_stream_answers_a_unary_graph_with_one_item(served: Served) -> None:
    assert list(grpc_client.stream(served.grpc, "relay", {"trail": []})) == [{"trail": ["a", "b"]}]
    done = subprocess.run(
        [
            str(SERVEGRAPH),
            "call",
            "--grpc",
            served.grpc,
            "--app",
            "pick",
            "--stream",
            "--header",
            "x-kind=second",
            "{}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, '{"trail": ["second"]}\n'), done.stderr


def test_a_node_failure_answers_with_an_error_naming_the_node(served: Served) -> None:
    with pytest.raises(CallError) as raised:
        grpc_client.call(served.grpc, "scale", {"no": "x"})
    assert raised.value.code is None  # the graph answered: not a gRPC failure
    assert raised.value.node in ("steps", "double")  # the ingress, or the step that raised
    # The error's type only: its message stays in the replica's log (issue 45).
    assert re.fullmatch(r'node "(steps|double)" failed: .*KeyError.*', str(raised.value)), raised.value
    assert "'x'" not in str(raised.value)
    with pytest.raises(CallError) as streamed:
        list(grpc_client.stream(served.grpc, "scale", {"no": "x"}))
    assert streamed.value.node in ("steps", "double")
    assert "KeyError" in str(streamed.value)


def test_an_unknown_application_is_a_clear_grpc_error(served: Served) -> None:
    with pytest.raises(CallError) as raised:
        grpc_client.call(served.grpc, "nope", {})
    assert raised.value.code == "NOT_FOUND"
    assert "calling application 'nope': Application 'nope' not found." in str(raised.value)
    done = subprocess.run(
        [str(SERVEGRAPH), "call", "--grpc", served.grpc, "--app", "nope", "{}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("servegraph call: gRPC NOT_FOUND calling application 'nope'"), done.stderr


def test_a_class_at_the_ingress_answers_graphservice_with_the_payload(served: Served) -> None:
    """User code at the ingress is called as a router would call it: `__call__(payload)`."""
    assert grpc_client.call(served.grpc, "plain", {"x": 1}) == {"x": 1, "trail": ["plain"]}
    assert list(grpc_client.stream(served.grpc, "plain", {})) == [{"trail": ["plain"]}]


def test_a_function_at_the_ingress_answers_graphservice(served: Served) -> None:
    """A function deployment becomes a class around it, called with the payload over gRPC."""
    assert grpc_client.call(served.grpc, "fn", {"x": 1}) == {"echo": {"x": 1}}
