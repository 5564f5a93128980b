"""`POST /v1/events`: a registry says "graph published"; matching ServeGraphs refresh.

The endpoint writes the `servegraph.io/refresh` annotation rather than acting
in memory: with several replicas behind one Service the request may reach a
standby, and the annotation is what the leader's watch will see. CloudEvents
are parsed by the CloudEvents SDK, in binary and structured mode alike.

Guessing the token is slowed down: each client address may fail authentication a
few times, then gets 429 for a while without the token being looked at. The
subject (a URL, maybe with a token in its query) is logged without its query.

An event is acknowledged (202) only once every ServeGraph it matches carries its
refresh annotation. When the token Secret cannot be read, or any matching ServeGraph
could not be annotated (the API server down, a timeout), the answer is 503 with
Retry-After: the sender keeps the event and sends it again, rather than the endpoint
keeping it in memory that a restart or a Lease loss would lose (docs/faults.md).
Sending it again is harmless: the annotation's value is the event's id, so a
ServeGraph annotated the first time is not written again.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from cloudevents.core.bindings.http import HTTPMessage, from_http_event

from servegraph.kube import KubeError
from servegraph.names import REFRESH_ANNOTATION
from servegraph.operator.cache import source_url
from servegraph.source import safe_url

log = logging.getLogger("servegraph.operator.events")

EVENT_TYPE = "io.servegraph.graph.published"
MAX_BODY = 64 * 1024
MAX_PEERS = 1024
"""Client addresses whose failed attempts are remembered; the fullest buckets are forgotten first."""
RETRY_AFTER_S = 5
"""What a 503 asks the sender to wait: an API server back from a restart answers within seconds."""
ANNOTATE_AT_ONCE = 8
"""Annotations in flight for one event: a selector may match thousands of ServeGraphs."""


class Unavailable(Exception):
    """The endpoint cannot act on an event now: the sender is to send it again (503)."""


class TokenBucket:
    """Allows `rate` requests a second with bursts of `burst`."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self) -> bool:
        self._refill()
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False

    def empty(self) -> bool:
        """Whether a request now would be refused (without taking anything)."""
        self._refill()
        return self._tokens < 1

    def full(self) -> bool:
        self._refill()
        return self._tokens >= self.burst

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now


class FailedAuth:
    """Failed authentications per client address: `burst` of them, then one per `1/rate` s."""

    def __init__(self, rate: float = 0.5, burst: int = 5, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
        self._peers: dict[str, TokenBucket] = {}

    def blocked(self, peer: str) -> bool:
        bucket = self._peers.get(peer)
        return bucket is not None and bucket.empty()

    def failed(self, peer: str) -> None:
        bucket = self._peers.get(peer)
        if bucket is None:
            if len(self._peers) >= MAX_PEERS:
                self._forget_recovered()
            bucket = self._peers[peer] = TokenBucket(self.rate, self.burst, self._clock)
        bucket.take()

    def _forget_recovered(self) -> None:
        for peer in [p for p, b in self._peers.items() if b.full()] or list(self._peers)[: MAX_PEERS // 2]:
            del self._peers[peer]

    def __len__(self) -> int:
        return len(self._peers)


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
    if published.url is not None and source_url(body) != published.url:
        return False
    if published.selector is not None:
        labels = (body.get("metadata") or {}).get("labels") or {}
        for key, value in published.selector:
            if key not in labels or (value is not None and labels[key] != value):
                return False
    return True


Annotate = Callable[[str, str, Mapping[str, str]], Awaitable[None]]
Token = Callable[[bool], Awaitable[str]]
"""The expected token; `token(True)` after a mismatch may read the Secret again (rate-limited).
Raises Unavailable when the Secret cannot be read: nobody can be told their token is wrong."""


@dataclass(frozen=True)
class Refreshed:
    """What one event did: the ServeGraphs annotated, and those that could not be (or were not
    tried once the API server was seen down)."""

    done: list[str]
    failed: list[str]


async def refresh(servegraphs: list[Mapping[str, Any]], event_id: str, annotate: Annotate) -> Refreshed:
    """Annotate each ServeGraph, `ANNOTATE_AT_ONCE` at a time. One gone since (404) needs nothing;
    once one fails because the API server is down or slow, the rest are not tried: the event is
    answered 503 within about one API timeout, not one per ServeGraph."""
    gate = asyncio.Semaphore(ANNOTATE_AT_ONCE)
    done: list[str] = []
    failed: list[str] = []
    down = False

    async def one(sg: Mapping[str, Any]) -> None:
        nonlocal down
        namespace, name = sg["metadata"]["namespace"], sg["metadata"]["name"]
        async with gate:
            if down:
                failed.append(f"{namespace}/{name}")
                return
            try:
                await annotate(namespace, name, {REFRESH_ANNOTATION: event_id})
            except KubeError as exc:
                if exc.status == 404:
                    return  # deleted since the watch delivered it
                down = down or _outage(exc)
                log.warning("cannot refresh ServeGraph %s/%s: %s", namespace, name, exc)
                failed.append(f"{namespace}/{name}")
                return
            except Exception as exc:  # any other failure: not acknowledged either
                log.warning("cannot refresh ServeGraph %s/%s: %s", namespace, name, type(exc).__name__)
                failed.append(f"{namespace}/{name}")
                return
            done.append(f"{namespace}/{name}")

    await asyncio.gather(*(one(sg) for sg in servegraphs))
    return Refreshed(sorted(done), sorted(failed))


def _outage(exc: KubeError) -> bool:
    """The API server is down, overloaded or cut off: the next write would fail as well."""
    return exc.reason in ("Unavailable", "Timeout") or exc.status == 429 or (exc.status or 0) >= 500


def events_app(
    token: Token,
    servegraphs: Callable[[str | None], Iterable[Mapping[str, Any]]],
    annotate: Annotate,
    limiter: TokenBucket | None = None,
    failures: FailedAuth | None = None,
    answered: Callable[[int], None] = lambda _status: None,
    synced: Callable[[], bool] = lambda: True,
) -> web.Application:
    """The endpoint; `token` is asked per request, so a rotated Secret applies within its cache time.

    `servegraphs(url)` gives the ServeGraphs an event may refresh: those naming that source
    URL (an index, not a scan: a registry announcing every publish of 10,000 tenants), or
    every one for an event that gives only a label selector. `answered` is told each answer's
    HTTP status (the metrics). Until `synced()` (the watches' first lists delivered) an event
    is answered 503: matched against a cache still filling, it would be acknowledged for none."""
    limiter = limiter or TokenBucket(rate=5, burst=20)
    failures = failures or FailedAuth()

    async def post(request: web.Request) -> web.Response:
        response = await answer(request)
        answered(response.status)
        return response

    async def answer(request: web.Request) -> web.Response:
        peer = request.remote or "unknown"
        if failures.blocked(peer):
            return _error(429, "too many failed authentications; slow down", headers={"Retry-After": "2"})
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("Bearer "):
            failures.failed(peer)
            return _error(401, "missing bearer token", headers={"WWW-Authenticate": "Bearer"})
        presented = auth[len("Bearer ") :].encode()
        try:
            expected = await token(False)
        except Unavailable:
            return _unavailable("the events token cannot be read now; send the event again")
        if not hmac.compare_digest(presented, expected.encode()):
            try:
                rotated = await token(True)  # the Secret may have just been rotated
            except Unavailable:
                failures.failed(peer)  # it did not match the token last read: a guess is counted
                return _unavailable("the events token cannot be read now; send the event again")
            if not hmac.compare_digest(presented, rotated.encode()):
                failures.failed(peer)
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
        if not synced():
            return _unavailable("the operator has not listed its ServeGraphs yet; send the event again")
        matching = [sg for sg in list(servegraphs(published.url)) if matches(sg, published)]
        result = await refresh(matching, published.event_id, annotate)
        what = safe_url(published.url) if published.url else published.selector
        if result.failed:
            log.warning(
                "graph published %s: %d of %d ServeGraphs not refreshed; answered 503",
                what,
                len(result.failed),
                len(matching),
            )
            reason = f"{len(result.failed)} of {len(matching)} matching ServeGraphs could not be refreshed"
            return _unavailable(f"{reason}; send the event again", refreshed=result.done, failed=result.failed)
        log.info("graph published %s: refreshing %d ServeGraphs", what, len(result.done))
        return web.json_response({"refreshed": result.done}, status=202)

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post("/v1/events", post)
    return app


def _unavailable(reason: str, **extra: list[str]) -> web.Response:
    """503 with Retry-After: a sender retries on 5xx, so the event is sent again, never dropped."""
    body = {"error": reason, **extra}
    return web.json_response(body, status=503, headers={"Retry-After": str(RETRY_AFTER_S)})


def _error(status: int, reason: str, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response({"error": reason}, status=status, headers=headers)
