"""GraphService's wire: payloads, items and errors as protobuf (`servegraph.v1.service_pb2`).

Payloads and items are `google.protobuf.Value`s, so what a gRPC client sends is what
an HTTP client's JSON body would be (numbers are doubles on this wire: 3 arrives as
3.0). Imported by a router on its first gRPC call only: the builder and HTTP serving
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
    payload = json_format.MessageToDict(request.payload) if request.HasField("payload") else None
    return payload, normalize_headers(request.headers.items())


def to_value(result: Any) -> struct_pb2.Value:
    """A JSON result as a protobuf Value; ValueError naming what does not fit."""
    value = struct_pb2.Value()
    try:
        json.dumps(result, allow_nan=False)  # ParseDict lets some non-JSON through (tuples, NaN)
        json_format.ParseDict(result, value)
    except (json_format.ParseError, TypeError, ValueError) as e:
        raise ValueError(f"result is not JSON: {e}") from None
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
