"""The event loop's longest stall while some work runs: what one tenant's input costs every
other tenant sharing the operator's loop. Used by the CA-bundle tests and the hostile bench,
so the figure a test bounds is the figure BENCHMARKS.md reports.

A gap leaves out the time the loop's thread was runnable but waiting for a CPU (Linux's
`/proc/thread-self/schedstat`): that is the machine's scheduler, not the work under test, and
on a busy machine (the node tier beside, at nice 19) it failed tests for being starved. Work
on the loop, a blocking call on it and a wait for the GIL still count in full."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import BinaryIO

TICK_S = 0.001
SCHEDSTAT = Path("/proc/thread-self/schedstat")


class LoopStall:
    """`async with LoopStall() as stall:` runs a 1 ms ticker around the block; afterwards
    `stall.worst_ms` is the longest gap between two of its turns beyond the tick itself and
    beyond the run-queue wait of the loop's thread in it."""

    def __init__(self, settle_s: float = 0.01) -> None:
        self.settle_s = settle_s  # the ticker's first turns, before the work starts
        self.worst_s = 0.0
        self._done = asyncio.Event()
        self._ticker: asyncio.Task[None] | None = None
        self._schedstat: BinaryIO | None = None

    @property
    def worst_ms(self) -> float:
        return self.worst_s * 1000

    async def __aenter__(self) -> LoopStall:
        with contextlib.suppress(OSError):  # not Linux: the wall-clock gap, as it is
            # procfs, not a disk; opened here because thread-self must be the loop's own thread
            self._schedstat = SCHEDSTAT.open("rb", buffering=0)  # noqa: ASYNC230
        self._ticker = asyncio.create_task(self._tick())
        await asyncio.sleep(self.settle_s)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._ticker is not None
        self._done.set()
        try:
            await self._ticker
        finally:
            if self._schedstat is not None:
                self._schedstat.close()

    def _waited(self) -> float:
        """The loop thread's run-queue wait so far, in s (the second field of schedstat, ns)."""
        if self._schedstat is None:
            return 0.0
        self._schedstat.seek(0)
        return int(self._schedstat.read().split()[1]) / 1e9

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        last, last_waited = loop.time(), self._waited()
        while not self._done.is_set():
            await asyncio.sleep(TICK_S)
            now, waited = loop.time(), self._waited()
            stall = now - last - TICK_S - (waited - last_waited)
            self.worst_s, last, last_waited = max(self.worst_s, stall), now, waited
