"""GraphService's wire: payloads, items and errors as protobuf (`servegraph.v1.service_pb2`).

Payloads and items are `google.protobuf.Value`s, so what a gRPC client sends is what
an HTTP client's JSON body would be. Numbers are doubles on this wire: a whole one is
read back as an int, on both ends, as the same JSON over HTTP would parse (`3`, not
`3.0`), so code written for HTTP payloads (`range(payload["n"])`) works unchanged.
Shared by the runtime and `servegraph.grpc_client`. Imported by a router on its first gRPC call only: the builder and HTTP serving
need no generated protobuf code, so an old protobuf in a Ray image costs only gRPC.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format, struct_pb2

from servegraph.runtime.payload import Headers, normalize_headers
from servegraph.v1 import service_pb2


def unpack(request: service_pb2.CallRequest | service_pb2.StreamRequest) -> tuple[Any, Headers]:
    """A request's payload as a Python value, and its headers."""
    payload = from_value(request.payload) if request.HasField("payload") else None
    return payload, normalize_headers(request.headers.items())


def to_value(data: Any) -> struct_pb2.Value:
    """A JSON value as a protobuf Value; ValueError naming what does not fit."""
    value = struct_pb2.Value()
    try:
        json.dumps(data, allow_nan=False)  # ParseDict lets some non-JSON through (tuples, NaN)
        json_format.ParseDict(data, value)
    except (json_format.ParseError, TypeError, ValueError) as e:
        raise ValueError(f"not a JSON value: {e}") from None
    return value


def from_value(value: struct_pb2.Value) -> Any:
    """A Value as JSON, whole numbers as ints (see the module docstring)."""
    return _whole(json_format.MessageToDict(value))


def _whole(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, list):
        return [_whole(v) for v in value]
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    return value


def error(body: Mapping[str, Any]) -> service_pb2.Error:
    """A failure body (`calls.failure_body`) as the proto Error."""
    return service_pb2.Error(
        message=str(body.get("error", "")), node=str(body.get("node", "")), timed_out=bool(body.get("timed_out"))
    )


def result(value: Any) -> service_pb2.CallResponse:
    return service_pb2.CallResponse(result=to_value(value))


def failed(body: Mapping[str, Any]) -> service_pb2.CallResponse:
    return service_pb2.CallResponse(error=error(body))


def item(value: Any) -> service_pb2.StreamResponse:
    return service_pb2.StreamResponse(item=to_value(value))


def stream_failed(body: Mapping[str, Any]) -> service_pb2.StreamResponse:
    return service_pb2.StreamResponse(error=error(body))
