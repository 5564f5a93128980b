"""How a stream and a gRPC call look on the wire (pure; testable without Ray).

HTTP: a streaming application answers with a chunked body, one item per chunk,
flushed as each item is produced: newline-delimited JSON (`application/x-ndjson`),
or Server-Sent Events (`text/event-stream`, `data: <json>` per item) when the
client's `Accept` asks for them. A failure mid-stream ends the body with an error
item: `{"error": ..., "node": ..., "timed_out": ...}` as the last NDJSON line, or
an `event: error` event.

gRPC's wire is `grpcwire.py`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from typing import Any

from servegraph.runtime.calls import failure_body

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"


def wants_events(headers: Mapping[str, str]) -> bool:
    """Whether the client asked for Server-Sent Events rather than NDJSON."""
    return SSE in headers.get("accept", "")


def encode_item(item: Any, events: bool) -> bytes:
    """One item as one chunk; ValueError/TypeError when it is not JSON."""
    text = json.dumps(item, allow_nan=False)
    return f"data: {text}\n\n".encode() if events else f"{text}\n".encode()


def encode_error(body: Mapping[str, Any], events: bool) -> bytes:
    text = json.dumps(body)
    return f"event: error\ndata: {text}\n\n".encode() if events else f"{text}\n".encode()


async def chunks(node_id: str, items: AsyncGenerator[Any, None], events: bool) -> AsyncGenerator[bytes, None]:
    """The body of a streaming response; a failure becomes the last chunk, an error item.

    Closing it (the client went away) closes `items`, which cancels the generators
    upstream (`calls.invoke_stream`).
    """
    try:
        async with aclosing(items):
            async for item in items:
                try:
                    chunk = encode_item(item, events)
                except (TypeError, ValueError) as e:
                    yield encode_error(
                        {"error": f"node {node_id!r}: item is not JSON-serializable: {e}", "node": node_id}, events
                    )
                    return
                yield chunk
    except Exception as e:
        yield encode_error(failure_body(e, node_id), events)
