"""Parse the untrusted bytes of a graph in a child process, with CPU and memory limits.

Why a process and not a thread: protobuf's upb parser holds the GIL for a whole
message. A 2.7 MB graph of 200,000 labels takes half a second in one C call, a
16 MiB `user_config` of tiny fields ten seconds, and while it runs no thread of
the operator does: not the event loop, not the Lease renewal. In a child the
parse may use one CPU up to its limit and is killed past it (RLIMIT_CPU, then
SIGXCPU, even inside C code); the operator's loop only waits on a pipe. The
validated model comes back pickled; the graph limits (nodes, labels, strings,
values) bound what unpickling it costs the operator.

The child is spawned (a fresh interpreter, none of the operator's state), kept
for the next parse, and replaced when it dies. It volunteers to be the kernel's
first OOM victim, so a parse that would exhaust the pod's memory costs a parse,
not the operator.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import multiprocessing
import os
import resource
import signal
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from servegraph.dag.model import Graph
from servegraph.graph import GraphError, Problem, parse_graph

log = logging.getLogger("servegraph.operator")

MiB = 1024 * 1024


class GraphParser:
    """`await parser.parse(data, max_bytes)`: a validated Graph, or GraphError."""

    def __init__(self, cpu_s: float = 10.0, memory_bytes: int = 768 * MiB) -> None:
        self.cpu_s = cpu_s
        self.memory_bytes = memory_bytes
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._lock = asyncio.Lock()

    def _start(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_child_init,
                initargs=(self.memory_bytes,),
            )
        return self._pool

    async def start(self) -> None:
        """Spawn the child now, so the first download does not wait for it."""
        async with self._lock:
            await asyncio.wrap_future(self._start().submit(os.getpid))

    async def parse(self, data: bytes, max_bytes: int) -> Graph:
        async with self._lock:  # one child, one parse at a time: bounded memory
            pool = self._start()
            future = asyncio.wrap_future(pool.submit(_parse_in_child, data, max_bytes, self.cpu_s))
            try:
                kind, value = await asyncio.wait_for(future, timeout=3 * self.cpu_s + 10)
            except (BrokenProcessPool, TimeoutError):
                self._kill()
                limit = f"{self.cpu_s:g} s of CPU and {self.memory_bytes // MiB} MiB of memory"
                log.warning("a graph parse was stopped at its limits (%s); the parser restarts", limit)
                raise GraphError([Problem("", f"the graph could not be parsed within {limit}")]) from None
        if kind == "invalid":
            raise GraphError([Problem(path, message) for path, message in value])
        graph: Graph = value
        return graph

    def _kill(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        # ProcessPoolExecutor cannot cancel a running call: end its process. `_processes`
        # is private, but the alternative is waiting for a parse that may never end.
        for process in list(getattr(pool, "_processes", {}).values()):
            with contextlib.suppress(Exception):
                process.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self._kill()


async def parse_here(data: bytes, max_bytes: int) -> Graph:
    """The same parse in a thread of this process: for tests and the command line."""
    return await asyncio.to_thread(parse_graph, data, max_bytes=max_bytes)


def _child_init(memory_bytes: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the operator's to handle
    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, memory_bytes))
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")


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
