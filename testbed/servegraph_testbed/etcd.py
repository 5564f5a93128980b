"""etcd's own API, for what a test does to storage under the API server: read its revision,
compact its history. Through etcd's JSON gateway (`/v3/...` on its client URL), so no
etcdctl is needed beside the server.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from typing import Any


def _post(port: int, path: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 (loopback http)
        data: dict[str, Any] = json.loads(answer.read())
    return data


def revision(port: int) -> int:
    """The store's current revision (what the API server calls the newest resourceVersion)."""
    answer = _post(port, "/v3/kv/range", {"key": base64.b64encode(b"/").decode(), "limit": 1, "keys_only": True})
    return int(answer["header"]["revision"])


def compact(port: int) -> int:
    """Drop every revision before the current one, as the API server's own compaction does
    every 5 minutes; returns that revision. A watch asking for anything older is then
    answered 410 Gone, once the API server's watch cache no longer holds it either (it is
    rebuilt from the current revision when the API server restarts)."""
    current = revision(port)
    _post(port, "/v3/kv/compaction", {"revision": current, "physical": True})
    return current
