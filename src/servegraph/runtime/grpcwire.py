"""GraphService's wire: payloads, items and errors as protobuf (`servegraph.v1.service_pb2`).

Payloads and items are `google.protobuf.Value`s, so what a gRPC client sends is what
an HTTP client's JSON body would be. Numbers are doubles on this wire: a whole one is
read back as an int, on both ends, as the same JSON over HTTP would parse (`3`, not
`3.0`), so code written for HTTP payloads (`range(payload["n"])`) works unchanged.
Headers travel as gRPC metadata, as HTTP's travel as HTTP headers: where a gateway in
front sees, sets and strips them. The request message's own `headers` map is refused:
read from the body, it let any caller pick a header switch's branch past any gateway.
Shared by the runtime and `servegraph.grpc_client`. Imported by a router on its first gRPC call only: the builder and HTTP serving
need no generated protobuf code, so an old protobuf in a Ray image costs only gRPC.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format, struct_pb2

from servegraph.runtime.payload import (
    Headers,
    Limits,
    PayloadRefused,
    normalize_headers,
    too_deep,
    too_many_bytes,
    too_many_items,
)
from servegraph.v1 import service_pb2


def unpack(
    request: service_pb2.CallRequest | service_pb2.StreamRequest, limits: Limits | None = None, context: Any = None
) -> tuple[Any, Headers]:
    """A request's payload as a Python value, and its headers from `context`'s metadata.

    `context` is Ray Serve's `RayServegRPCContext` (None: no headers). PayloadRefused over
    `limits`, and for headers in the message. Ray's gRPC proxy refuses a message over its
    size (set to `Limits.max_bytes` in the rendered RayService); the text here is counted
    again, for a Ray started without it."""
    if request.headers:
        raise PayloadRefused(HEADERS_IN_MESSAGE, too_large=False)
    payload = from_value(request.payload, limits) if request.HasField("payload") else None
    return payload, metadata_headers(context)


HEADERS_IN_MESSAGE = (
    "headers in the request message are refused: send them as gRPC metadata, "
    "where a gateway in front of the graph sees them, as HTTP headers"
)


def metadata_headers(context: Any) -> Headers:
    """The call's text metadata as headers (binary `-bin` keys are no headers)."""
    if context is None:
        return {}
    items = [(k, v) for k, v in context.invocation_metadata() if isinstance(v, str) and not k.endswith("-bin")]
    return normalize_headers(items)


def to_value(data: Any) -> struct_pb2.Value:
    """A JSON value as a protobuf Value; ValueError naming what does not fit."""
    value = struct_pb2.Value()
    try:
        json.dumps(data, allow_nan=False)  # ParseDict lets some non-JSON through (tuples, NaN)
        json_format.ParseDict(data, value)
    except (json_format.ParseError, TypeError, ValueError) as e:
        raise ValueError(f"not a JSON value: {e}") from None
    return value


def from_value(value: struct_pb2.Value, limits: Limits | None = None) -> Any:
    """A Value as JSON, whole numbers as ints (see the module docstring); PayloadRefused over `limits`.

    Walked here rather than by `json_format.MessageToDict`, which took 2.9 s and 300 MiB for
    a 4 MiB list of a million empty objects: a list's or object's length is compared with
    the values left before any element is converted, so that one is refused at once.
    """
    limits = limits or _UNBOUNDED
    left = [limits.max_items]
    text = [limits.max_bytes]

    def spend(string: str) -> str:
        text[0] -= len(string)
        if text[0] < 0:
            raise too_many_bytes(limits)
        return string

    def convert(item: struct_pb2.Value, depth: int) -> Any:
        left[0] -= 1
        if left[0] < 0:
            raise too_many_items(limits)
        kind = item.WhichOneof("kind")
        if kind == "struct_value" or kind == "list_value":
            if depth > limits.max_depth:
                raise too_deep(limits)
            if kind == "struct_value":
                fields = item.struct_value.fields
                if len(fields) > left[0]:
                    raise too_many_items(limits)
                return {spend(key): convert(inner, depth + 1) for key, inner in fields.items()}
            values = item.list_value.values
            if len(values) > left[0]:
                raise too_many_items(limits)
            return [convert(inner, depth + 1) for inner in values]
        if kind == "number_value":
            number = item.number_value
            if not math.isfinite(number):
                raise PayloadRefused(f"not a JSON number: {number}", too_large=False)
            return int(number) if number.is_integer() and abs(number) < 2**53 else number
        if kind == "string_value":
            return spend(item.string_value)
        if kind == "bool_value":
            return item.bool_value
        return None  # null_value, or no kind at all (as json_format reads it)

    return convert(value, 1)


_UNBOUNDED = Limits(max_bytes=2**63, max_items=2**63, max_depth=200)
"""What a client reads back: protobuf's own parser stops nesting at 100 messages (50 levels)."""


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


def refused(refusal: PayloadRefused, context: Any) -> service_pb2.CallResponse:
    """A payload over a limit: the gRPC status naming it, set on Ray Serve's context, and the error."""
    _set_status(refusal, context)
    return service_pb2.CallResponse(error=service_pb2.Error(message=str(refusal)))


def stream_refused(refusal: PayloadRefused, context: Any) -> service_pb2.StreamResponse:
    """As `refused`, for a stream: its one message, so that Ray's proxy applies the context."""
    _set_status(refusal, context)
    return service_pb2.StreamResponse(error=service_pb2.Error(message=str(refusal)))


def _set_status(refusal: PayloadRefused, context: Any) -> None:
    if context is None:  # called other than through Ray's gRPC proxy
        return
    import grpc  # Ray Serve's own dependency, there whenever its gRPC proxy is

    context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED if refusal.too_large else grpc.StatusCode.INVALID_ARGUMENT)
    context.set_details(str(refusal))
