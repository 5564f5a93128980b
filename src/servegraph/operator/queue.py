"""A work queue with per-key de-duplication and rate-limited retries.

The shape of client-go's workqueue: a key is processed by one worker at a time;
adding a key while it is processed marks it dirty so it runs once more after;
failures back off exponentially per key. Triggers (watch events, timers,
webhooks) only add keys, so a burst of events costs one reconcile.
"""

from __future__ import annotations

import asyncio
import random
from collections import deque
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
JITTER = (0.8, 1.2)


class WorkQueue(Generic[K]):
    def __init__(self, base_delay_s: float = 1.0, max_delay_s: float = 300.0) -> None:
        self._items: deque[K] = deque()
        self._nonempty = asyncio.Event()
        self._queued: set[K] = set()
        self._processing: set[K] = set()
        self._dirty: set[K] = set()
        self._failures: dict[K, int] = {}
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._base = base_delay_s
        self._max = max_delay_s

    def add(self, key: K) -> None:
        if key in self._processing:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._items.append(key)
            self._nonempty.set()

    def add_after(self, key: K, delay_s: float) -> None:
        """Add later; an earlier pending timer for the key wins over a later one."""
        loop = asyncio.get_running_loop()
        when = loop.time() + max(0.0, delay_s)
        timer = self._timers.get(key)
        if timer is not None and not timer.cancelled() and timer.when() <= when:
            return
        if timer is not None:
            timer.cancel()
        self._timers[key] = loop.call_at(when, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def retry(self, key: K) -> float:
        """Requeue after a failure with exponential backoff and jitter; returns the delay."""
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        delay: float = min(self._max, self._base * 2**n) * random.uniform(*JITTER)  # noqa: S311 - jitter
        self.add_after(key, delay)
        return delay

    @property
    def min_retry_delay_s(self) -> float:
        """The earliest a retry can come: the first one, at its lowest jitter."""
        return min(self._max, self._base) * JITTER[0]

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def discard(self, key: K) -> None:
        """Drop every trace of a key (its object was deleted): queued, dirty, timed or backing off."""
        self.forget(key)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        self._dirty.discard(key)
        if key in self._queued:
            self._queued.discard(key)
            self._items.remove(key)

    async def get(self) -> K:
        while not self._items:
            self._nonempty.clear()
            await self._nonempty.wait()
        key = self._items.popleft()
        self._queued.discard(key)
        self._processing.add(key)
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def __len__(self) -> int:
        return len(self._queued)
