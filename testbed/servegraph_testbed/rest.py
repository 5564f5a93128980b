"""A tiny synchronous REST client for the harness's own few calls (readiness, CRDs, RBAC).

The harness runs from sync code (fixtures, `make demo`, bench) and must not depend on
an event loop, so it speaks HTTPS with the standard library instead of an API client.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

Json = dict[str, Any]
APPLY_PATCH = "application/apply-patch+yaml"
JSON_PATCH = "application/json-patch+json"
FIELD_MANAGER = "servegraph-testenv"


class ApiError(RuntimeError):
    """A non-2xx answer; `status` is the HTTP code, `body` the decoded Status if any."""

    def __init__(self, method: str, path: str, status: int, body: Any) -> None:
        self.status = status
        self.body = body
        message = body.get("message", body) if isinstance(body, dict) else body
        super().__init__(f"{method} {path}: HTTP {status}: {message}")


class Rest:
    """Bearer-token HTTPS to one API server, trusting only the given CA."""

    def __init__(self, server: str, ca_file: Path, token: str) -> None:
        self.server = server.rstrip("/")
        self._ctx = ssl.create_default_context(cafile=str(ca_file))
        self._token = token

    def request(
        self,
        method: str,
        path: str,
        body: Json | list[Json] | None = None,
        content_type: str = "application/json",
        timeout: float = 10.0,
    ) -> Any:
        """Send one request; return the decoded JSON (or text) answer, raise ApiError on >= 400."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)  # noqa: S310
        req.add_header("Authorization", f"Bearer {self._token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._ctx, timeout=timeout) as resp:  # noqa: S310
                return _decode(resp.read())
        except urllib.error.HTTPError as e:
            raise ApiError(method, path, e.code, _decode(e.read())) from None

    def get(self, path: str, timeout: float = 10.0) -> Any:
        return self.request("GET", path, timeout=timeout)

    def apply(self, path: str, obj: Json) -> Json:
        """Server-side apply `obj` at its object URL (create or update, idempotent)."""
        query = f"?fieldManager={FIELD_MANAGER}&force=true"
        result: Json = self.request("PATCH", path + query, obj, content_type=APPLY_PATCH)
        return result

    def probe(self, path: str) -> tuple[bool, str]:
        """(answered 200, short detail) without raising: for readiness polling."""
        try:
            self.request("GET", path, timeout=2.0)
        except ApiError as e:
            return False, f"HTTP {e.status}: {_last_failed_check(e.body)}"
        except OSError as e:
            return False, str(e)
        return True, "ok"


def _decode(raw: bytes) -> Any:
    text = raw.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def _last_failed_check(body: Any) -> str:
    """From a /readyz?verbose answer, the checks that failed (else the raw body, shortened)."""
    text = body if isinstance(body, str) else json.dumps(body)
    failed = [line for line in text.splitlines() if line.startswith("[-]")]
    return "; ".join(failed) if failed else text[:200]
