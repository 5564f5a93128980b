"""Parse the untrusted bytes of a graph in a child process, with CPU and memory limits.

Why a process and not a thread: protobuf's upb parser holds the GIL for a whole
message. A 2.7 MB graph of 200,000 labels takes half a second in one C call, a
16 MiB `user_config` of tiny fields ten seconds, and while it runs no thread of
the operator does: not the event loop, not the Lease renewal. In a child the
parse may use one CPU up to its limit and is killed past it (RLIMIT_CPU, then
SIGXCPU, even inside C code); the operator's loop only waits on a pipe. The
validated model comes back pickled; the graph limits (nodes, labels, strings,
values) bound what unpickling it costs the operator.

Each child is a fresh interpreter (`parse_child`, none of the operator's state)
answering over its stdin and stdout, which the event loop reads itself: no executor
threads. It is kept for the next parse, and replaced when it dies. It volunteers to be the kernel's
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

Small graphs skip the child (`parse_small`): within `INLINE_BYTES` and `INLINE_NODES`
a parse holds the loop ~5 ms at most for a valid graph and ~8 ms for the costliest
hostile one we built (3,684 problems in 16 KiB; bench/security_bench.py), while the trip
to a child costs ~1.2 ms on top of a typical tenant graph's ~1.4 ms parse (pickling,
the pipe, unpickling, two wake-ups): that was half of what parsing cost the operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import math
import os
import pickle
import sys
from pathlib import Path
from typing import Any

from servegraph.dag.model import Graph
from servegraph.graph import GraphError, Problem, decode, parse_graph
from servegraph.graph.validate import to_model
from servegraph.operator.fetch import parse_child
from servegraph.operator.fetch.fairness import FairQueue

log = logging.getLogger("servegraph.operator")

MiB = 1024 * 1024
MAX_DEFAULT_WORKERS = 4
"""Each child holds ~40 MiB idle and more while it parses (BENCHMARKS.md): the default
stops at four to stay well inside the Deployment's 512 MiB. `--parse-workers` goes past it."""

CHILD_NICENESS = parse_child.CHILD_NICENESS
PIPE_LIMIT = 4 * MiB
"""The pipe reader's buffer: an answer (a pickled graph, tens of KiB for hundreds of nodes) is read in few reads."""
INLINE_BYTES = 16 * 1024
INLINE_NODES = 200
"""A graph within both limits parses on the event loop (`parse_small`); the bytes are checked
before decoding, the nodes after (decoding 16 KiB is microseconds, validating is what costs)."""
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
        await asyncio.gather(*(c.ready() for c in self._children))

    async def parse(self, data: bytes, max_bytes: int, tenant: str | None = None) -> Graph:
        small = parse_small(data, max_bytes)
        if small is not None:
            return small
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
        try:
            # Children sharing a CPU take longer in wall time; the CPU limit is the real bound.
            timeout = (self.workers + 2) * self.cpu_s + 10
            result = await asyncio.wait_for(child.call(data, max_bytes, self.cpu_s), timeout=timeout)
        except asyncio.CancelledError:
            child.kill()  # its parse cannot be cancelled: the next one must not wait for it
            raise
        except (OSError, EOFError, TimeoutError):  # died (SIGXCPU, out of memory, killed) or overran
            child.kill()
            limit = f"{self.cpu_s:g} s of CPU and {self.memory_bytes // MiB} MiB of memory"
            log.warning("a graph parse was stopped at its limits (%s); the parser restarts", limit)
            raise GraphError([Problem("", f"the graph could not be parsed within {limit}")]) from None
        return result

    def running(self, tenant: str) -> int:
        """Parses of `tenant` holding a child now."""
        return self._queue.running(tenant)

    def waiting(self) -> int:
        """Parses waiting for a child."""
        return self._queue.waiting()

    def pids(self) -> tuple[int | None, ...]:
        """Each child's process id; None for one not running (not spawned yet, or exited)."""
        return tuple(c.pid if c.alive() else None for c in self._children)

    async def close(self) -> None:
        """Stop every child and wait until each has exited, so its pipes are closed while the loop still runs."""
        await asyncio.gather(*(child.stop() for child in self._children))


class _Child:
    """One parse process (`parse_child`), spawned when first needed and again after it died.

    Used by one parse at a time (`GraphParser` hands it out), so its pipes need no lock.
    """

    def __init__(self, memory_bytes: int) -> None:
        self.memory_bytes = memory_bytes
        self._process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def alive(self) -> bool:
        """Spawned and not known to have exited."""
        return self._process is not None and self._process.returncode is None

    async def ready(self) -> tuple[asyncio.StreamWriter, asyncio.StreamReader]:
        """The running child's pipes; spawned, and its imports done, first if need be."""
        process = self._process
        if process is None or process.returncode is not None:
            process = self._process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                parse_child.__name__,
                str(self.memory_bytes),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                limit=PIPE_LIMIT,
            )
            assert process.stdout is not None
            if await process.stdout.readexactly(len(parse_child.READY)) != parse_child.READY:
                raise EOFError("the parse child did not start")
        assert process.stdin is not None and process.stdout is not None
        return process.stdin, process.stdout

    async def call(self, data: bytes, max_bytes: int, cpu_s: float) -> tuple[str, Any]:
        """One parse; EOFError (`IncompleteReadError`) or OSError when the child died meanwhile."""
        send, receive = await self.ready()
        send.write(parse_child.REQUEST.pack(len(data), max_bytes, cpu_s))
        send.write(data)
        await send.drain()
        (size,) = parse_child.ANSWER.unpack(await receive.readexactly(parse_child.ANSWER.size))
        # Our own child's pickle of a model it built (as a process pool's result would be): the
        # untrusted bytes were parsed there, and no graph content can become a pickle opcode.
        kind, value = pickle.loads(await receive.readexactly(size))  # noqa: S301
        if kind == "error":
            raise ParserFailed(f"the graph parser failed with {value}")
        return kind, value

    def kill(self) -> None:
        """End the child now; it is reaped (and its pipes closed) in the background."""
        process, self._process = self._process, None
        if process is not None:
            _REAPING.add(task := asyncio.ensure_future(_end(process)))
            task.add_done_callback(_REAPING.discard)

    async def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            await _end(process)


_REAPING: set[asyncio.Future[None]] = set()
"""Children killed mid-parse, until they have exited (a task nobody holds may be collected)."""


async def _end(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(process.wait(), timeout=10)


class ParserFailed(Exception):
    """The parse raised something other than GraphError: a bug, reported as such, not the graph's fault."""


def default_workers() -> int:
    """Parse children for this process's CPU budget (its cgroup's CPU limit, or the CPUs it may
    run on): at least two, so one slow graph never holds every parse; at most four by default."""
    cpus = float(len(os.sched_getaffinity(0)))
    with contextlib.suppress(OSError, ValueError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota != "max":
            cpus = min(cpus, int(quota) / int(period))
    return min(MAX_DEFAULT_WORKERS, max(2, math.ceil(cpus)))


def parse_small(data: bytes, max_bytes: int) -> Graph | None:
    """The graph parsed here, when it is small enough (`INLINE_BYTES`, `INLINE_NODES`); None when
    it is not and a child must parse it. GraphError as from a child; a bug is `ParserFailed`
    naming its type only, as a child reports it."""
    if len(data) > INLINE_BYTES:
        return None
    try:
        msg = decode(data, max_bytes=max_bytes)
        if sum(len(app.nodes) for app in msg.applications) > INLINE_NODES:
            return None
        return to_model(msg)
    except GraphError:
        raise
    except Exception as exc:
        raise ParserFailed(f"the graph parser failed with {type(exc).__name__}") from None


async def parse_here(data: bytes, max_bytes: int) -> Graph:
    """The same parse in a thread of this process: for tests and the command line."""
    return await asyncio.to_thread(parse_graph, data, max_bytes=max_bytes)
