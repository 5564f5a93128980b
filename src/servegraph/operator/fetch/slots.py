"""Downloads at once per namespace: one tenant cannot take every worker.

A worker that finds its namespace's slots taken does not wait for one (waiting
would hold the worker just the same): it parks the ServeGraph and moves on. A
freed slot wakes one ServeGraph parked in that namespace, the oldest. Waking every
one made each freed slot a pass over all of them, nearly all parking again: a
thousand ServeGraphs created at once in one namespace took ~50,000 reconciles.
The one woken is handed the slot's turn until its reconcile ends (`done`): one that
took no slot (deleted meanwhile, no longer due, suspended) passes the turn on, so
the others are never left parked with a slot free.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from servegraph.names import Key


class NamespaceSlots:
    def __init__(self, per_namespace: int, wake: Callable[[Key], None]) -> None:
        self.per_namespace = max(1, per_namespace)
        self._wake = wake
        self._busy: dict[str, int] = {}
        self._parked: dict[str, OrderedDict[Key, None]] = {}
        self._handed: set[Key] = set()
        """Woken for a freed slot, their reconcile not yet ended."""

    def acquire(self, key: Key) -> bool:
        """Take a slot of the key's namespace, or park the key and return False."""
        namespace = key[0]
        handed = key in self._handed
        self._handed.discard(key)
        if self._busy.get(namespace, 0) >= self.per_namespace:
            parked = self._parked.setdefault(namespace, OrderedDict())
            parked[key] = None
            if handed:  # woken, and another took the slot first: still the oldest
                parked.move_to_end(key, last=False)
            return False
        self._busy[namespace] = self._busy.get(namespace, 0) + 1
        waiting = self._parked.get(namespace)
        if waiting is not None:
            waiting.pop(key, None)
            if not waiting:
                del self._parked[namespace]
        return True

    def release(self, key: Key) -> None:
        namespace = key[0]
        left = self._busy.get(namespace, 1) - 1
        if left:
            self._busy[namespace] = left
        else:
            self._busy.pop(namespace, None)
        self._wake_next(namespace)

    def done(self, key: Key) -> None:
        """The key's reconcile ended: a turn it was handed and did not use goes to the next."""
        if key in self._handed:
            self._handed.discard(key)
            self._wake_next(key[0])

    def forget(self, key: Key) -> None:
        """A deleted ServeGraph leaves no trace, and passes on a turn it was handed."""
        parked = self._parked.get(key[0])
        if parked is not None:
            parked.pop(key, None)
            if not parked:
                del self._parked[key[0]]
        self.done(key)

    def _wake_next(self, namespace: str) -> None:
        parked = self._parked.get(namespace)
        if not parked or self._busy.get(namespace, 0) >= self.per_namespace:
            return  # nobody waits, or the slot is taken again: its release wakes the next
        key, _ = parked.popitem(last=False)
        if not parked:
            del self._parked[namespace]
        self._handed.add(key)
        self._wake(key)

    def busy(self, namespace: str) -> int:
        return self._busy.get(namespace, 0)

    def parked(self, namespace: str) -> int:
        return len(self._parked.get(namespace, ()))

    def __len__(self) -> int:
        """Namespaces with any state (for the tests that check nothing grows without bound)."""
        return len(self._busy.keys() | self._parked.keys() | {key[0] for key in self._handed})
