"""How an HTTP request becomes the payload routers pass around, and back.

Kept apart from the router deployments so the rules are testable without Ray.
See `servegraph.runtime` for the rules in prose.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

Headers = dict[str, str]
"""Request headers, names lower-cased; the first value wins for repeated names."""


def payload_from_body(body: bytes) -> Any:
    """JSON if the body parses as JSON, else its UTF-8 text; None for an empty body."""
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError:  # JSONDecodeError and UnicodeDecodeError both are
        return body.decode("utf-8", errors="replace")


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
