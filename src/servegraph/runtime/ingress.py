"""The canary's choice at the ingress router: which version serves a request, and its mirror.

Per request, in this order (docs/runtime.md#canaries):

1. `VERSION_HEADER` (HTTP header or gRPC metadata) pins it: the canary's or the live
   version string, or `canary` / `stable`; any other value is ignored.
2. A sticky key (the header or the top-level JSON payload field the canary names): a stable
   hash of it gives a bucket 0-99, and the canary serves the bucket iff it is below the
   weight — so a key stays on its version while the weight grows.
3. Else the next point of a low-discrepancy sequence (`Spread`), with the weight as the
   canary's percent: the share a canary gets is its weight over any stretch of requests,
   not a random share of it, and the two versions take turns instead of runs.

A request the live version serves (and nobody pinned) is also copied to the canary with the
mirror's probability: fire-and-forget, its answer dropped, at most `MIRRORS_IN_FLIGHT` per
replica and none while the replica is busy (its client requests in flight reach the
ingress's `max_ongoing_requests`): under load the copies go first.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from servegraph.dag.args import CANARY, LIVE, PIN_ALIASES, ROUTE_HEADER, VERSION_HEADER, Settings
from servegraph.runtime.choice import Spread
from servegraph.runtime.payload import Headers, switch_value

logger = logging.getLogger("ray.serve")

MIRRORS_IN_FLIGHT = 8
"""Copies to the canary one ingress replica has in flight at most."""
MIRROR_CALLER = "mirror"
"""The `caller` of the ingress edge of a copy: never a client's."""


def bucket(key: str) -> int:
    """0-99, the same for a key in every replica and every release (not Python's `hash`)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") % 100


def choose(
    settings: Settings,
    default_version: str,
    payload: Any,
    headers: Headers,
    split: Callable[[], float],
    draw: Callable[[], float],
) -> tuple[str, bool]:
    """(the route serving this request, whether to mirror it to the canary); `split` and `draw`
    give floats in [0, 100): the next `Spread` point for the version, a uniform draw for the mirror."""
    canary = settings.canary
    if canary is None:
        return LIVE, False
    pin = headers.get(VERSION_HEADER)
    if pin is not None:
        live_version = settings.live.version if settings.live is not None else default_version
        if pin == canary.version or PIN_ALIASES.get(pin) == CANARY:
            return CANARY, False
        if pin == live_version or PIN_ALIASES.get(pin) == LIVE:
            return LIVE, False
    key: str | None = None
    if canary.sticky is not None:
        sticky = canary.sticky
        key = (
            headers.get(sticky.header)
            if sticky.header is not None
            else switch_value(payload, {}, field=sticky.field, header=None)
        )
    chosen = CANARY if (bucket(key) if key is not None else split()) < canary.weight else LIVE
    return chosen, chosen == LIVE and canary.mirror > 0 and draw() < canary.mirror


class Admission:
    """One ingress replica's part: the route it chose per request, its client requests in
    flight, and the mirrors it runs."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()  # noqa: S311 - uniformity, not secrecy
        self._split = Spread(self._draw())
        self.in_flight = 0
        self.mirrors: set[asyncio.Future[Any]] = set()
        self.dropped = 0
        """Copies not made because the replica was busy or had enough in flight."""

    def admit(self, settings: Settings, default_version: str, payload: Any, headers: Headers) -> tuple[Headers, bool]:
        """The headers the request goes on with (`ROUTE_HEADER` set by us, never by the client)
        and whether to mirror it."""
        if settings.canary is None and settings.live is None:
            if ROUTE_HEADER in headers:
                headers = {k: v for k, v in headers.items() if k != ROUTE_HEADER}
            return headers, False
        route, mirror = choose(settings, default_version, payload, headers, self._split, self._draw)
        return {**headers, ROUTE_HEADER: route}, mirror

    def _draw(self) -> float:
        return self._rng.random() * 100.0

    def mirror(self, busy: int, run: Callable[[], Awaitable[Any]]) -> bool:
        """Start a copy unless the replica is busy or has enough copies in flight; whether it started."""
        if len(self.mirrors) >= MIRRORS_IN_FLIGHT or (busy and self.in_flight >= busy):
            self.dropped += 1
            return False
        task = asyncio.ensure_future(_quietly(run))
        self.mirrors.add(task)
        task.add_done_callback(self.mirrors.discard)
        return True


async def _quietly(run: Callable[[], Awaitable[Any]]) -> None:
    """A copy's answer and failure stay here: recorded by `run`, never raised to anyone."""
    try:
        await run()
    except Exception as e:  # the canary's failure is evidence, not a client's error
        logger.debug("servegraph mirror failed: %s", type(e).__name__)
