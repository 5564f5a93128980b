"""Call a served graph over gRPC (servegraph's GraphService), as `servegraph call --grpc` does.

grpcio is imported by the first call, not with this module: the operator and its
image have no use for it, while Ray Serve (`ray[serve]`) brings it along. Payloads
and results are plain JSON values on this side and `google.protobuf.Value` on the
wire; the application is chosen by the `application` metadata key, as for any
call through Ray Serve's gRPC proxy, and headers travel as metadata too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from servegraph.extras import needs_extra
from servegraph.runtime.grpcwire import from_value, to_value
from servegraph.v1 import service_pb2

APPLICATION_METADATA = "application"
"""The metadata key Ray Serve's gRPC proxy routes by."""
DEFAULT_TIMEOUT_S = 60.0


class CallError(Exception):
    """A call that did not answer: the graph's own error (a node failed or timed out)
    or the gRPC status (no such application, unreachable, deadline exceeded)."""

    def __init__(self, message: str, *, code: str | None = None, node: str | None = None, timed_out: bool = False):
        self.code = code
        """The gRPC status code's name when gRPC failed; None when the graph answered with an error."""
        self.node = node or None
        self.timed_out = timed_out
        super().__init__(message)


def call(
    target: str,
    application: str,
    payload: Any,
    headers: Mapping[str, str] | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Any:
    """The application's result for one request; raises CallError."""
    grpc, stubs = _grpc()
    request = service_pb2.CallRequest(payload=to_value(payload))
    with grpc.insecure_channel(target) as channel:
        try:
            response = stubs.GraphServiceStub(channel).Call(
                request, metadata=_metadata(application, headers), timeout=timeout_s
            )
        except grpc.RpcError as e:
            raise _rpc_error(e, application) from None
    if response.HasField("error"):
        raise _graph_error(response.error)
    return from_value(response.result)


def stream(
    target: str,
    application: str,
    payload: Any,
    headers: Mapping[str, str] | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> Iterator[Any]:
    """The application's items as they arrive; raises CallError, also after items when
    the stream ended with an error. `timeout_s` bounds the whole stream."""
    grpc, stubs = _grpc()
    request = service_pb2.StreamRequest(payload=to_value(payload))
    # A consumer that stops early closes the channel, which cancels the stream: the
    # graph's generators stop too.
    with grpc.insecure_channel(target) as channel:
        responses = stubs.GraphServiceStub(channel).Stream(
            request, metadata=_metadata(application, headers), timeout=timeout_s
        )
        failed: CallError | None = None
        try:
            for response in responses:
                if response.HasField("error"):
                    # The last message; the status after it says more when it is not OK
                    # (a request refused over a limit), so it is read before raising.
                    failed = _graph_error(response.error)
                    continue
                yield from_value(response.item)
        except grpc.RpcError as e:
            raise _rpc_error(e, application) from None
        if failed is not None:
            raise failed


def _metadata(application: str, headers: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    """The application to route to, and the headers: gRPC metadata, as a gateway sees them.

    Names are lower-cased (gRPC requires it; the graph matches them case-insensitively).
    `application` is Ray Serve's routing key, so no header may take that name."""
    extra = tuple((name.lower(), value) for name, value in (headers or {}).items())
    if any(name == APPLICATION_METADATA for name, _ in extra):
        raise CallError(f"{APPLICATION_METADATA!r} is the metadata key Ray Serve routes by, not a header")
    return ((APPLICATION_METADATA, application), *extra)


def _graph_error(error: service_pb2.Error) -> CallError:
    """The graph's error; its node named once (servegraph's routers name it in the message too)."""
    message = error.message or "failed"
    if error.node and f'"{error.node}"' not in message:
        message = f'node "{error.node}": {message}'
    return CallError(message, node=error.node, timed_out=error.timed_out)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NO_METHOD = re.compile(r"Tried to call a method '(Call|Stream)' that does not exist")


def _rpc_error(e: Any, application: str) -> CallError:
    """grpc.RpcError (a grpc.Call too) as a CallError naming the status and the application.

    Ray Serve sends a replica's whole traceback as the details: its last line says what
    happened, the rest stays in Ray's logs.
    """
    code = e.code()
    name = code.name if code is not None else "UNKNOWN"
    lines = [line.strip() for line in _ANSI.sub("", e.details() or "").splitlines() if line.strip()]
    details = lines[-1] if lines else ""
    if _NO_METHOD.search(details):
        details += (
            " (the application's ingress is a function deployment, which has no methods to add: "
            "GraphService needs a router or a class there)"
        )
    return CallError(f"gRPC {name} calling application {application!r}: {details}".rstrip(": "), code=name)


def _grpc() -> tuple[Any, Any]:
    with needs_extra("ray"):
        import grpc

        from servegraph.v1 import service_pb2_grpc
    return grpc, service_pb2_grpc
