"""`POST /v1/events`: a registry says "graph published"; matching ServeGraphs refresh.

The endpoint writes the `servegraph.io/refresh` annotation rather than acting
in memory: with several replicas behind one Service the request may reach a
standby, and the annotation is what the leader's watch will see. CloudEvents
are parsed by the CloudEvents SDK, in binary and structured mode alike.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from cloudevents.core.bindings.http import HTTPMessage, from_http_event

from servegraph.operator.spec import REFRESH_ANNOTATION

log = logging.getLogger("servegraph.operator.events")

EVENT_TYPE = "io.servegraph.graph.published"
MAX_BODY = 64 * 1024


class TokenBucket:
    """Allows `rate` requests a second with bursts of `burst`."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False


@dataclass(frozen=True)
class Published:
    """What a "graph published" event asks for: by URL, or by label selector."""

    event_id: str
    url: str | None
    selector: tuple[tuple[str, str | None], ...] | None


def parse_selector(text: str) -> tuple[tuple[str, str | None], ...]:
    """Equality-based label selector: `a=b,c==d,e` (e: the label exists)."""
    terms: list[tuple[str, str | None]] = []
    for raw in text.split(","):
        term = raw.strip()
        if not term:
            continue
        if "!=" in term:
            raise ValueError(f"unsupported selector term {term!r}: only = and existence")
        key, sep, value = term.replace("==", "=").partition("=")
        if not key.strip():
            raise ValueError(f"selector term {term!r} has no label key")
        terms.append((key.strip(), value.strip() if sep else None))
    if not terms:
        raise ValueError("empty label selector")
    return tuple(terms)


def parse_event(headers: Mapping[str, str], body: bytes) -> Published:
    """A validated Published request, or ValueError saying what is wrong."""
    try:
        event = from_http_event(HTTPMessage(headers=dict(headers), body=body))
    except Exception as exc:  # the SDK raises many types for malformed input
        raise ValueError(f"not a CloudEvent: {exc}") from None
    if event.get_type() != EVENT_TYPE:
        raise ValueError(f"unsupported event type {event.get_type()!r}; expected {EVENT_TYPE!r}")
    data = event.get_data()
    if isinstance(data, bytes | str):
        try:
            data = json.loads(data) if data else None
        except ValueError:
            raise ValueError("event data is not JSON") from None
    selector_text = data.get("labelSelector") if isinstance(data, dict) else None
    url = event.get_subject()
    if not url and not selector_text:
        raise ValueError("set `subject` to the graph's source URL or data.labelSelector")
    selector = parse_selector(str(selector_text)) if selector_text else None
    return Published(event_id=event.get_id(), url=url or None, selector=selector)


def matches(body: Mapping[str, Any], published: Published) -> bool:
    if published.url is not None:
        url = ((body.get("spec") or {}).get("source") or {}).get("url")
        if url != published.url:
            return False
    if published.selector is not None:
        labels = (body.get("metadata") or {}).get("labels") or {}
        for key, value in published.selector:
            if key not in labels or (value is not None and labels[key] != value):
                return False
    return True


Annotate = Callable[[str, str, Mapping[str, str]], Any]


def events_app(
    token: Callable[[], str | None],
    servegraphs: Callable[[], Iterable[Mapping[str, Any]]],
    annotate: Annotate,
    limiter: TokenBucket | None = None,
) -> web.Application:
    """The endpoint; `token()` is read per request so a rotated Secret applies at once."""
    limiter = limiter or TokenBucket(rate=5, burst=20)

    async def post(request: web.Request) -> web.Response:
        expected = token()
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer ") or not expected:
            return _error(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(auth[len("Bearer ") :].encode(), expected.encode()):
            return _error(403, "wrong bearer token")
        if not limiter.take():
            return _error(429, "too many events; slow down", headers={"Retry-After": "1"})
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"body over {MAX_BODY} bytes")
        try:
            published = parse_event(request.headers, body)
        except ValueError as exc:
            return _error(400, str(exc))
        refreshed = []
        for sg in list(servegraphs()):
            if matches(sg, published):
                meta = sg["metadata"]
                await annotate(meta["namespace"], meta["name"], {REFRESH_ANNOTATION: published.event_id})
                refreshed.append(f"{meta['namespace']}/{meta['name']}")
        log.info("graph published %s: refreshing %d ServeGraphs", published.url or published.selector, len(refreshed))
        return web.json_response({"refreshed": sorted(refreshed)}, status=202)

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post("/v1/events", post)
    return app


def _error(status: int, reason: str, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response({"error": reason}, status=status, headers=headers)
