"""How an HTTP request becomes the payload routers pass around, and back.

Kept apart from the router deployments so the rules are testable without Ray.
See `servegraph.runtime` for the rules in prose.

Whoever reaches a graph's ports sends the payload, so it is bounded before anything
holds it whole (`Limits`): the body's bytes as it is read, then its values and depth,
checked in time proportional to the limit, not to what was sent. A request over one is
refused naming it (`PayloadRefused`): HTTP 413 or 400, gRPC RESOURCE_EXHAUSTED or
INVALID_ARGUMENT. Each limit is an environment variable of the replica, so an
application raises its own through its `runtime_env`.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

Headers = dict[str, str]
"""Request headers, names lower-cased; the first value wins for repeated names."""

MiB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """What one request may hold, at the ingress (HTTP body, gRPC payload)."""

    max_bytes: int = 4 * MiB
    """gRPC's own default receive size; the rendered RayService sets Ray's gRPC proxy to it too."""
    max_items: int = 100_000
    """Values in a payload: every object, array, string, number, boolean and null counts one."""
    max_collect_s: int = 60
    """How long a stream answered as one (`collect`) may take."""
    max_depth: int = 32
    """Objects and arrays inside one another. Over gRPC, protobuf's parser stops first at ~49
    (100 messages: a Value and its ListValue per level), with a less helpful error."""

    ENV: ClassVar[dict[str, str]] = {
        "max_bytes": "SERVEGRAPH_MAX_REQUEST_BYTES",
        "max_items": "SERVEGRAPH_MAX_PAYLOAD_ITEMS",
        "max_depth": "SERVEGRAPH_MAX_PAYLOAD_DEPTH",
        "max_collect_s": "SERVEGRAPH_MAX_COLLECT_SECONDS",
    }

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Limits:
        """The defaults, each replaced by its variable when that is a positive whole number.

        Depth stays under 500: the checks recurse, one frame per level."""
        values: dict[str, int] = {}
        for name, variable in cls.ENV.items():
            text = env.get(variable, "").strip()
            if text.isdigit() and int(text) > 0:
                values[name] = int(text)
        if "max_depth" in values:
            values["max_depth"] = min(values["max_depth"], 500)
        return cls(**values)


class PayloadRefused(ValueError):
    """A request over a limit: `too_large` (bytes, values) or too deep; the message names the limit."""

    def __init__(self, message: str, *, too_large: bool) -> None:
        super().__init__(message)
        self.too_large = too_large

    @property
    def http_status(self) -> int:
        return 413 if self.too_large else 400

    def body(self) -> dict[str, Any]:
        return {"error": str(self)}


def too_many_bytes(limits: Limits) -> PayloadRefused:
    variable = Limits.ENV["max_bytes"]
    return PayloadRefused(f"request over the limit of {limits.max_bytes} bytes ({variable})", too_large=True)


def too_many_items(limits: Limits) -> PayloadRefused:
    variable = Limits.ENV["max_items"]
    return PayloadRefused(f"payload over the limit of {limits.max_items} values ({variable})", too_large=True)


def too_deep(limits: Limits) -> PayloadRefused:
    variable = Limits.ENV["max_depth"]
    return PayloadRefused(f"payload nested deeper than {limits.max_depth} ({variable})", too_large=False)


def _too_long(what: str, name: str) -> PayloadRefused:
    return PayloadRefused(
        f"the stream is over the limit of {what} ({Limits.ENV[name]}) for one answer: "
        "call Stream to receive its items as they come",
        too_large=True,
    )


async def collect(items: AsyncIterator[Any], limits: Limits) -> list[Any]:
    """A stream's items as one answer (GraphService `Call`, a plain handle call), within the limits.

    At most `max_items` items and `max_bytes` of their JSON (what one gRPC message may
    carry anyway), within `max_collect_s`: past any, PayloadRefused, and the caller's
    `aclosing` closes the stream, which cancels its generators upstream. An item that is
    not JSON (a plain handle call may pass any picklable value) counts its text.
    """
    collected: list[Any] = []
    size = 0
    deadline = asyncio.timeout(limits.max_collect_s)
    try:
        async with deadline:
            async for item in items:
                if len(collected) == limits.max_items:
                    raise _too_long(f"{limits.max_items} items", "max_items")
                size += len(json.dumps(item, default=str))
                if size > limits.max_bytes:
                    raise _too_long(f"{limits.max_bytes} bytes", "max_bytes")
                collected.append(item)
    except TimeoutError:
        if not deadline.expired():
            raise  # a node's own TimeoutError
        raise _too_long(f"{limits.max_collect_s} s", "max_collect_s") from None
    return collected


class Body(Protocol):
    """What the ingress reads of an HTTP request (starlette's `Request`)."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    def stream(self) -> AsyncIterator[bytes]: ...


async def read_body(request: Body, limits: Limits) -> bytes:
    """The body, read no further than the limit: a declared length over it is refused unread."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_bytes:
        raise too_many_bytes(limits)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limits.max_bytes:
            raise too_many_bytes(limits)
        chunks.append(chunk)
    return b"".join(chunks)


def payload_from_body(body: bytes, limits: Limits | None = None) -> Any:
    """JSON if the body parses as JSON, else its UTF-8 text; None for an empty body.

    With `limits`, a body or JSON value over them raises PayloadRefused."""
    if not body:
        return None
    if limits is not None and len(body) > limits.max_bytes:
        raise too_many_bytes(limits)
    try:
        value = json.loads(body)
    except RecursionError:  # deeper than the interpreter's stack: deeper than any limit
        raise too_deep(limits or Limits()) from None
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both are
        return body.decode("utf-8", errors="replace")
    if limits is not None:
        check(value, limits)
    return value


def check(value: Any, limits: Limits) -> None:
    """Refuse a JSON value with more values or deeper nesting than `limits`.

    A container's length is compared with what is left before its elements are looked
    at, so a list of a million empty objects is refused at once."""
    left = [limits.max_items]

    def visit(item: Any, depth: int) -> None:
        left[0] -= 1
        if left[0] < 0:
            raise too_many_items(limits)
        if isinstance(item, dict | list):
            if depth > limits.max_depth:
                raise too_deep(limits)
            if len(item) > left[0]:
                raise too_many_items(limits)
            for inner in item.values() if isinstance(item, dict) else item:
                visit(inner, depth + 1)

    visit(value, 1)


def normalize_headers(items: Any) -> Headers:
    """Lower-case header names so `switch.header` matches case-insensitively."""
    out: Headers = {}
    for name, value in items:
        out.setdefault(str(name).lower(), str(value))
    return out


def switch_value(payload: Any, headers: Mapping[str, str], *, field: str | None, header: str | None) -> str | None:
    """The string a switch compares with its cases' `equals`, or None to take the default.

    A string field compares as-is; other JSON scalars by their JSON text (true,
    false, null, 3, 2.5) so `equals: "true"` matches a boolean; objects and
    arrays never match. A payload that is not a JSON object has no fields.
    """
    if header is not None:
        return headers.get(header.lower())
    if field is None or not isinstance(payload, Mapping) or field not in payload:
        return None
    value = payload[field]
    if isinstance(value, str):
        return value
    if value is None or isinstance(value, bool | int | float):
        return json.dumps(value)
    return None
