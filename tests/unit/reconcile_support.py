"""A ServeGraph, its watches and its registry around a Reconciler on the in-memory API (unit tests)."""

from __future__ import annotations

import copy
from typing import Any

from memory_api import MemoryApiServer, MemoryRegistry
from support import SAMPLES

from servegraph.names import REFRESH_ANNOTATION, Key
from servegraph.operator.metrics import Metrics
from servegraph.operator.queue import WorkQueue
from servegraph.operator.reconcile import Reconciler, RetryLater

NS, NAME = "team-a", "mini"
KEY: Key = (NS, NAME)
URL = "https://registry.test/v1/graphs/mini"
TOKEN = "s3cret"
MINI = (SAMPLES / "mini.pb").read_bytes()


async def reconcile_through_downloads(reconciler: Reconciler, key: Key) -> float | None:
    """A reconcile as the workers run it, and the one its download's end queues: what one pass
    did before downloads ran beside the workers (operator/fetch/downloads.py)."""
    while True:
        try:
            result = await reconciler.reconcile(key)
        except RetryLater:
            if not reconciler.downloads.busy(key):
                raise
            result = None
        if not reconciler.downloads.busy(key):
            return result
        await reconciler.downloads.ended(key)
        reconciler.queue.discard(key)  # what the download's end queued: run here, as a worker would


class Cluster:
    """A ServeGraph with its token Secret, the watches that feed the reconciler, and the registry."""

    def __init__(self, **source: Any) -> None:
        self.api = MemoryApiServer()
        self.registry = MemoryRegistry(token=TOKEN, graphs={URL: MINI})
        self.queue: WorkQueue[Key] = WorkQueue()
        self.reconciler = Reconciler(self.api, self.registry, Metrics(), self.queue)
        self.api.servegraphs[KEY] = {
            "apiVersion": "servegraph.io/v1alpha1",
            "kind": "ServeGraph",
            "metadata": {"name": NAME, "namespace": NS, "uid": "uid-1", "generation": 1},
            "spec": {"source": {"url": URL, "tokenSecretRef": {"name": "registry-token"}, **source}},
        }
        self.api.add_secret(NS, "registry-token", token=TOKEN + "\n")

    @property
    def body(self) -> dict[str, Any]:
        return self.api.servegraphs[KEY]

    def watch_servegraph(self) -> None:
        self.reconciler.servegraph_changed(copy.deepcopy(self.body))

    def watch_rayservice(self, deleted: bool = False) -> None:
        self.reconciler.rayservice_changed(copy.deepcopy(self.api.rayservices[KEY]), deleted=deleted)
        if deleted:
            del self.api.rayservices[KEY]

    async def reconcile(self) -> float | None:
        return await reconcile_through_downloads(self.reconciler, KEY)

    async def started(self) -> None:
        """Start-up: the watch lists the ServeGraph, the first reconcile applies, and the
        watches deliver what it wrote."""
        self.watch_servegraph()
        await self.reconcile()
        self.watch_servegraph()
        self.watch_rayservice()
        self.api.calls.clear()
        self.api.events.clear()

    def condition(self, type_: str) -> tuple[str, str]:
        found = next(c for c in self.body["status"]["conditions"] if c["type"] == type_)
        return found["status"], found["reason"]

    def publish(self, data: bytes) -> None:
        self.registry.graphs[URL] = data
        meta = self.body["metadata"]
        meta["annotations"] = {REFRESH_ANNOTATION: str(len(self.registry.requests))}  # as the events endpoint does
        self.watch_servegraph()
