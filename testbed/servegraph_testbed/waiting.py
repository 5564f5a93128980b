"""Waiting for eventual state in tests: controllers converge, they do not answer at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    check: Callable[[], Awaitable[T]],
    *,
    within: float = 60.0,
    interval: float = 0.25,
    what: str = "condition",
) -> T:
    """Await `check()` until it returns a truthy value (returned) or `within` s pass.

    Exceptions count as "not yet"; on timeout the AssertionError names `what` and the
    last value or exception, so a failing test says what it was waiting for.
    """
    deadline = time.monotonic() + within
    last: object = None
    while True:
        try:
            value = await check()
        except Exception as e:  # any error means "not yet"
            last = e
        else:
            if value:
                return value
            last = value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {within:.0f} s; last: {last!r}")
        await asyncio.sleep(interval)
