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

    An exception from `check` (a failed assert in it, a refused call) means "not yet". On
    timeout the AssertionError names `what` and what the last attempt saw: the exception,
    message unescaped and chained as the cause (so the traceback shows the line of the check
    that failed), or the falsy value it returned.
    """
    deadline = time.monotonic() + within
    while True:
        error: Exception | None = None
        try:
            value = await check()
        except Exception as e:  # any error means "not yet"
            error = e
        else:
            if value:
                return value
        if time.monotonic() > deadline:
            last = repr(value) if error is None else _describe(error)
            raise AssertionError(f"{what} not reached within {within:g} s; last: {last}") from error
        await asyncio.sleep(interval)


def _describe(error: Exception) -> str:
    message = str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__
