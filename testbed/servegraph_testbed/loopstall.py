"""The event loop's longest stall while some work runs: what one tenant's input costs every
other tenant sharing the operator's loop. Used by the CA-bundle tests and the hostile bench,
so the figure a test bounds is the figure BENCHMARKS.md reports."""

from __future__ import annotations

import asyncio

TICK_S = 0.001


class LoopStall:
    """`async with LoopStall() as stall:` runs a 1 ms ticker around the block; afterwards
    `stall.worst_ms` is the longest gap between two of its turns beyond the tick itself."""

    def __init__(self, settle_s: float = 0.01) -> None:
        self.settle_s = settle_s  # the ticker's first turns, before the work starts
        self.worst_s = 0.0
        self._done = asyncio.Event()
        self._ticker: asyncio.Task[None] | None = None

    @property
    def worst_ms(self) -> float:
        return self.worst_s * 1000

    async def __aenter__(self) -> LoopStall:
        self._ticker = asyncio.create_task(self._tick())
        await asyncio.sleep(self.settle_s)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._ticker is not None
        self._done.set()
        await self._ticker

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        last = loop.time()
        while not self._done.is_set():
            await asyncio.sleep(TICK_S)
            now = loop.time()
            self.worst_s, last = max(self.worst_s, now - last - TICK_S), now
