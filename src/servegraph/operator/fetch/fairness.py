"""Round robin across tenants (namespaces) for a few shared workers (pure).

One operator parses every namespace's graphs on a handful of child processes. First
come, first served lets a tenant that publishes slow graphs on every poll keep them
all busy, and every other namespace waits behind it. Here each tenant has its own
queue; a freed worker goes to the waiting tenant served least recently that is under
its share, so a tenant waits for at most one item of each other waiting tenant, and
one tenant never holds every worker while there are two or more.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from typing import Generic, TypeVar

T = TypeVar("T")


class FairQueue(Generic[T]):
    """Items waiting for one of `workers` workers, served by tenant in turn.

    `put` queues; `take` hands out the next item that may start now (or None) and
    counts it as running until `finished`. The turn goes to the waiting tenant served
    least recently (one never served, or not since it last had nothing to do, first;
    ties in the order they came), among those under their share.
    """

    def __init__(self, workers: int, share: int | None = None) -> None:
        if workers < 1:
            raise ValueError("workers must be 1 or more")
        self.workers = workers
        self.share = max(1, workers - 1) if share is None else max(1, min(share, workers))
        """Workers one tenant may hold at once: by default all but one, so another tenant can
        always start."""
        self._waiting: OrderedDict[str, deque[T]] = OrderedDict()  # in the order tenants came
        self._running: Counter[str] = Counter()
        self._served: dict[str, int] = {}  # tenant → when it last started an item (a counter)
        self._clock = 0

    def put(self, tenant: str, item: T) -> None:
        self._waiting.setdefault(tenant, deque()).append(item)

    def discard(self, tenant: str, item: T) -> bool:
        """Drop a waiting item (its caller gave up); False if it is not waiting."""
        items = self._waiting.get(tenant)
        if items is None or item not in items:
            return False
        items.remove(item)
        if not items:
            del self._waiting[tenant]
            self._forget_if_idle(tenant)
        return True

    def take(self) -> tuple[str, T] | None:
        """The next (tenant, item) to start, if a worker is free and a tenant under its share waits."""
        if sum(self._running.values()) >= self.workers:
            return None
        best: tuple[int, str] | None = None
        for tenant in self._waiting:
            if self._running[tenant] < self.share:
                turn = self._served.get(tenant, -1)
                if best is None or turn < best[0]:
                    best = (turn, tenant)
        if best is None:
            return None
        tenant = best[1]
        items = self._waiting[tenant]
        item = items.popleft()
        if not items:
            del self._waiting[tenant]
        self._running[tenant] += 1
        self._served[tenant] = self._clock
        self._clock += 1
        return tenant, item

    def finished(self, tenant: str) -> None:
        self._running[tenant] -= 1
        if self._running[tenant] <= 0:
            del self._running[tenant]
            self._forget_if_idle(tenant)

    def _forget_if_idle(self, tenant: str) -> None:
        """A tenant with nothing running or waiting leaves no trace (namespaces come and go)."""
        if tenant not in self._waiting and tenant not in self._running:
            self._served.pop(tenant, None)

    def running(self, tenant: str) -> int:
        return self._running[tenant]

    def waiting(self) -> int:
        return sum(len(items) for items in self._waiting.values())

    def tenants(self) -> int:
        """Tenants with something running or waiting, or remembered for their turn."""
        return len(set(self._waiting) | set(self._running) | set(self._served))
