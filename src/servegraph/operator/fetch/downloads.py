"""Downloads run as tasks of their own, beside the reconcile workers, fair across namespaces.

A download can take its whole deadline (a registry that is down, or one that trickles
its body), and a reconcile worker that awaited it was held that long: four slow
registries held every worker, and every other ServeGraph's reconcile — its status, its
rollout, an image change that needs no download — queued behind them (issue 45, issue 44).
So a reconcile that needs a download only asks for one (`start`) and goes on with what it
has; the download's end queues the ServeGraph again, and that reconcile takes the result
(`take`) and records it.

Downloads at once: at most `per_namespace` of one namespace, so one tenant's registries
never hold more than that; at most `total` in all, bounding the memory bodies take
(each up to the size limit); a freed place goes to the namespace served least recently
(`FairQueue`), so a tenant with many ServeGraphs waits its turn like every other.

A result is taken only for the request it answers (the same source and refresh value):
a newer request cancels an older download of the same ServeGraph, and a download whose
result is never taken (the ServeGraph deleted, the Lease lost) leaves nothing recorded,
so whoever reconciles next downloads again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from servegraph.names import Key
from servegraph.operator.cache import Memory
from servegraph.operator.fetch import parsing
from servegraph.operator.fetch.download import Downloaded
from servegraph.operator.fetch.fairness import FairQueue
from servegraph.operator.spec import Source

log = logging.getLogger("servegraph.operator")

Run = Callable[[Key, Memory, Source, "str | None"], Awaitable[Downloaded]]
"""One download and its parse (`Downloader.run`)."""


@dataclass(frozen=True, slots=True)
class Request:
    """What a download was asked for: a ServeGraph's source and refresh annotation value."""

    source: Source
    refresh: str | None


@dataclass(frozen=True)
class Finished:
    """A download's end: its result, or the exception nobody foresaw that ended it."""

    request: Request
    result: Downloaded | None = None
    error: Exception | None = field(default=None, repr=False)


@dataclass
class _Job:
    key: Key
    request: Request
    memory: Memory
    task: asyncio.Task[Finished] | None = None
    over: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once it ended, was dropped or cancelled."""


class Downloads:
    def __init__(self, run: Run, wake: Callable[[Key], None], per_namespace: int = 2, total: int = 64) -> None:
        self._run = run
        self._wake = wake
        """Queues a ServeGraph whose download ended (the work queue's `add`)."""
        self._fair: FairQueue[_Job] = FairQueue(max(1, total), share=max(1, per_namespace))
        self._jobs: dict[Key, _Job] = {}
        """Each ServeGraph's download asked for, waiting its turn or running."""
        self._finished: dict[Key, Finished] = {}

    def start(self, key: Key, memory: Memory, source: Source, refresh: str | None) -> None:
        """Ask for the download of `source`, unless it is asked for already: one asked for
        with another source or refresh value is dropped (a running one cancelled)."""
        request = Request(source, refresh)
        job = self._jobs.get(key)
        if job is not None:
            if job.request == request:
                return
            self._drop(job)
        self._finished.pop(key, None)
        job = self._jobs[key] = _Job(key, request, memory)
        self._fair.put(key[0], job)
        self._hand_out()

    def take(self, key: Key, source: Source, refresh: str | None) -> Finished | None:
        """The end of the download asked for `source` and `refresh`, once; None while none has ended."""
        finished = self._finished.get(key)
        if finished is None or finished.request != Request(source, refresh):
            return None
        del self._finished[key]
        return finished

    def busy(self, key: Key) -> bool:
        """Whether a download of this ServeGraph is asked for and has not ended."""
        return key in self._jobs

    async def ended(self, key: Key) -> None:
        """Wait until the download asked for this ServeGraph (if any) ended or was dropped."""
        job = self._jobs.get(key)
        if job is not None:
            await job.over.wait()

    def cancel(self, key: Key) -> None:
        """The ServeGraph is gone or suspended: its download stops and its result is dropped."""
        job = self._jobs.get(key)
        if job is not None:
            self._drop(job)
        self._finished.pop(key, None)

    def cancel_all(self) -> None:
        """This process stops reconciling (the Lease lost, shutdown): nothing in flight is kept."""
        for job in list(self._jobs.values()):
            self._drop(job)
        self._finished.clear()

    def running(self, namespace: str | None = None) -> int:
        """Downloads in flight, of one namespace or in all."""
        jobs = self._jobs.values()
        return sum(1 for j in jobs if j.task is not None and (namespace is None or j.key[0] == namespace))

    def waiting(self) -> int:
        return self._fair.waiting()

    def __len__(self) -> int:
        """ServeGraphs with any state here (for the tests that check nothing grows without bound)."""
        return len(self._jobs.keys() | self._finished.keys())

    def _drop(self, job: _Job) -> None:
        del self._jobs[job.key]
        if job.task is None:
            self._fair.discard(job.key[0], job)
            job.over.set()
        else:
            job.task.cancel()  # its place is freed as it ends (`_ended`)

    def _hand_out(self) -> None:
        while (ready := self._fair.take()) is not None:
            _, job = ready
            job.task = asyncio.create_task(self._download(job), name=f"download {job.key[0]}/{job.key[1]}")
            # A callback, not a `finally`: a task cancelled before it first ran never enters its coroutine.
            job.task.add_done_callback(lambda task, job=job: self._ended(job, task))  # type: ignore[misc]

    async def _download(self, job: _Job) -> Finished:
        parsing.TENANT.set(job.key[0])  # its parse, if it needs a child, is shared round robin by namespace
        try:
            result = await self._run(job.key, job.memory, job.request.source, job.request.refresh)
        except Exception as exc:  # outside the download's own handling: reported by the reconcile
            return Finished(job.request, error=exc)
        return Finished(job.request, result)

    def _ended(self, job: _Job, task: asyncio.Task[Finished]) -> None:
        job.over.set()
        self._fair.finished(job.key[0])
        if self._jobs.get(job.key) is job:
            del self._jobs[job.key]
            if not task.cancelled():
                self._finished[job.key] = task.result()
                self._wake(job.key)
        self._hand_out()
