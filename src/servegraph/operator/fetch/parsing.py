"""Parse the untrusted bytes of a graph in a child process, with CPU and memory limits.

Why a process and not a thread: protobuf's upb parser holds the GIL for a whole
message. A 2.7 MB graph of 200,000 labels takes half a second in one C call, a
16 MiB `user_config` of tiny fields ten seconds, and while it runs no thread of
the operator does: not the event loop, not the Lease renewal. In a child the
parse may use one CPU up to its limit and is killed past it (RLIMIT_CPU, then
SIGXCPU, even inside C code); the operator's loop only waits on a pipe. The
validated model comes back pickled; the graph limits (nodes, labels, strings,
values) bound what unpickling it costs the operator.

Each child is spawned (a fresh interpreter, none of the operator's state), kept
for the next parse, and replaced when it dies. It volunteers to be the kernel's
first OOM victim, so a parse that would exhaust the pod's memory costs a parse,
not the operator.

There are several children, shared across namespaces round robin
(`fairness.FairQueue`): a tenant publishing a graph that takes the whole CPU budget
on every poll keeps at most all but one child busy, and waits its turn like
everyone else. The namespace is the reconcile's (`TENANT`, set by the worker), so
the reconcile's I/O need not carry it. The limits stay per child and per parse:
RLIMIT_CPU counts CPU time, not wall time, so children sharing a CPU limit only
take longer, none is cut short. Children run at a lower priority (niceness 10): when
CPUs are short, the operator's loop and other work go first.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import logging
import math
import multiprocessing
import os
import resource
import signal
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from servegraph.dag.model import Graph
from servegraph.graph import GraphError, Problem, parse_graph
from servegraph.operator.run.fairness import FairQueue

log = logging.getLogger("servegraph.operator")

MiB = 1024 * 1024
MAX_DEFAULT_WORKERS = 4
"""Each child holds ~40 MiB idle and more while it parses (BENCHMARKS.md): the default
stops at four to stay well inside the Deployment's 512 MiB. `--parse-workers` goes past it."""

CHILD_NICENESS = 10
TENANT: contextvars.ContextVar[str] = contextvars.ContextVar("servegraph_parse_tenant", default="")
"""Whose parse this is (the ServeGraph's namespace): the worker sets it for each reconcile."""


class GraphParser:
    """`await parser.parse(data, max_bytes)`: a validated Graph, or GraphError.

    `workers` children, each parsing one graph at a time, handed out round robin by
    tenant (`TENANT`, or the `tenant` argument).
    """

    def __init__(self, cpu_s: float = 10.0, memory_bytes: int = 768 * MiB, workers: int = 1) -> None:
        self.cpu_s = cpu_s
        self.memory_bytes = memory_bytes
        self.workers = workers
        self._children = [_Child(memory_bytes) for _ in range(workers)]
        self._idle = list(self._children)
        self._queue: FairQueue[asyncio.Future[_Child]] = FairQueue(workers)

    async def start(self) -> None:
        """Spawn the children now, so the first downloads do not wait for them."""
        await asyncio.gather(*(asyncio.wrap_future(c.pool().submit(os.getpid)) for c in self._children))

    async def parse(self, data: bytes, max_bytes: int, tenant: str | None = None) -> Graph:
        who = TENANT.get() if tenant is None else tenant
        child = await self._turn(who)
        try:
            kind, value = await self._run(child, data, max_bytes)
        finally:
            self._done(who, child)
        if kind == "invalid":
            raise GraphError([Problem(path, message) for path, message in value])
        graph: Graph = value
        return graph

    async def _turn(self, tenant: str) -> _Child:
        """A child, when the round robin gives this tenant one."""
        turn: asyncio.Future[_Child] = asyncio.get_running_loop().create_future()
        self._queue.put(tenant, turn)
        self._hand_out()
        try:
            return await turn
        except asyncio.CancelledError:
            if not self._queue.discard(tenant, turn) and turn.done() and not turn.cancelled():
                self._done(tenant, turn.result())  # given a child as it was cancelled: pass it on
            raise

    def _done(self, tenant: str, child: _Child) -> None:
        self._idle.append(child)
        self._queue.finished(tenant)
        self._hand_out()

    def _hand_out(self) -> None:
        while self._idle:
            ready = self._queue.take()
            if ready is None:
                return
            tenant, turn = ready
            if turn.done():  # cancelled before its turn came
                self._queue.finished(tenant)
                continue
            turn.set_result(self._idle.pop())

    async def _run(self, child: _Child, data: bytes, max_bytes: int) -> tuple[str, Any]:
        future = asyncio.wrap_future(child.pool().submit(_parse_in_child, data, max_bytes, self.cpu_s))
        try:
            # Children sharing a CPU take longer in wall time; the CPU limit is the real bound.
            result: tuple[str, Any] = await asyncio.wait_for(future, timeout=(self.workers + 2) * self.cpu_s + 10)
        except asyncio.CancelledError:
            child.kill()  # its parse cannot be cancelled: the next one must not wait for it
            raise
        except (BrokenProcessPool, TimeoutError):
            child.kill()
            limit = f"{self.cpu_s:g} s of CPU and {self.memory_bytes // MiB} MiB of memory"
            log.warning("a graph parse was stopped at its limits (%s); the parser restarts", limit)
            raise GraphError([Problem("", f"the graph could not be parsed within {limit}")]) from None
        return result

    def close(self) -> None:
        for child in self._children:
            child.kill()


class _Child:
    """One parse process, spawned when first needed and again after it was killed."""

    def __init__(self, memory_bytes: int) -> None:
        self.memory_bytes = memory_bytes
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def pool(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_child_init,
                initargs=(self.memory_bytes,),
            )
        return self._pool

    def kill(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        # ProcessPoolExecutor cannot cancel a running call: end its process. `_processes`
        # is private, but the alternative is waiting for a parse that may never end.
        for process in list(getattr(pool, "_processes", {}).values()):
            with contextlib.suppress(Exception):
                process.kill()
        pool.shutdown(wait=False, cancel_futures=True)


def default_workers() -> int:
    """Parse children for this process's CPU budget (its cgroup's CPU limit, or the CPUs it may
    run on): at least two, so one slow graph never holds every parse; at most four by default."""
    cpus = float(len(os.sched_getaffinity(0)))
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cpus = min(cpus, int(quota) / int(period))
    return min(MAX_DEFAULT_WORKERS, max(2, math.ceil(cpus)))


async def parse_here(data: bytes, max_bytes: int) -> Graph:
    """The same parse in a thread of this process: for tests and the command line."""
    return await asyncio.to_thread(parse_graph, data, max_bytes=max_bytes)


def _child_init(memory_bytes: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the operator's to handle
    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, memory_bytes))
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    # When CPUs are short, the operator's loop (its Lease, other namespaces' reconciles) runs
    # first; a parse still gets all the CPU nobody else wants.
    with contextlib.suppress(OSError):
        os.nice(CHILD_NICENESS)


def _parse_in_child(data: bytes, max_bytes: int, cpu_s: float) -> tuple[str, Any]:
    """Runs in the child: this parse may use `cpu_s` more seconds of CPU, then SIGXCPU ends it."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = int(usage.ru_utime + usage.ru_stime + cpu_s) + 1
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    try:
        return "ok", parse_graph(data, max_bytes=max_bytes)
    except GraphError as exc:
        return "invalid", [(p.path, p.message) for p in exc.problems]
    except MemoryError:
        return "invalid", [("", "the graph needs more memory to parse than the operator allows")]
