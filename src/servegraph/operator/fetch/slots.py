"""Downloads at once per namespace: one tenant cannot take every worker.

A worker that finds its namespace's slots taken does not wait for one (waiting
would hold the worker just the same): it parks the ServeGraph and moves on. A
freed slot queues every ServeGraph parked in that namespace, oldest first; those
that still need a download try again, and the rest (deleted, no longer due) do not
hold the others back.
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

    def acquire(self, key: Key) -> bool:
        """Take a slot of the key's namespace, or park the key and return False."""
        namespace = key[0]
        if self._busy.get(namespace, 0) >= self.per_namespace:
            self._parked.setdefault(namespace, OrderedDict())[key] = None
            return False
        self._busy[namespace] = self._busy.get(namespace, 0) + 1
        parked = self._parked.get(namespace)
        if parked is not None:
            parked.pop(key, None)
            if not parked:
                del self._parked[namespace]
        return True

    def release(self, key: Key) -> None:
        namespace = key[0]
        left = self._busy.get(namespace, 1) - 1
        if left:
            self._busy[namespace] = left
        else:
            self._busy.pop(namespace, None)
        for waiting in self._parked.pop(namespace, {}):
            self._wake(waiting)

    def forget(self, key: Key) -> None:
        """A deleted ServeGraph leaves no trace."""
        parked = self._parked.get(key[0])
        if parked is not None:
            parked.pop(key, None)
            if not parked:
                del self._parked[key[0]]

    def busy(self, namespace: str) -> int:
        return self._busy.get(namespace, 0)

    def __len__(self) -> int:
        """Namespaces with any state (for the tests that check nothing grows without bound)."""
        return len(self._busy.keys() | self._parked.keys())
