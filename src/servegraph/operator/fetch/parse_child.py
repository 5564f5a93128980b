"""The graph parser's child process: `python -m servegraph.operator.fetch.parse_child MEMORY_BYTES`.

It reads parse requests on stdin and answers each on its own copy of stdout, one at a
time, until stdin closes (the operator stopped or let it go). No executor machinery
on either side: the operator's event loop reads the answer from the pipe itself, where
a `ProcessPoolExecutor` ran a manager thread and a feeder thread per call, whose
wake-ups and GIL hand-offs cost the operator more CPU than unpickling the answer
(BENCHMARKS.md, issue 25).

The wire, both ways little-endian: a request is `REQUEST` (the graph's length, the byte
limit, the CPU seconds this parse may use) then the graph; an answer is `ANSWER` (the
payload's length) then the pickled `(kind, value)`: ("ok", Graph), ("invalid",
[(path, message)]) or ("error", exception type name). The child writes one `READY`
byte once its imports are done, so the operator's start-up waits for them and the first
parse does not.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import resource
import signal
import struct
import sys
from typing import Any, BinaryIO

from servegraph.graph import GraphError, parse_graph

REQUEST = struct.Struct("<QQd")
ANSWER = struct.Struct("<Q")
READY = b"R"
CHILD_NICENESS = 10


def main(argv: list[str]) -> int:
    memory_bytes = int(argv[0])
    _limit(memory_bytes)
    requests = os.fdopen(0, "rb")
    # The answers get their own descriptor; fd 1 becomes stderr, so nothing a library prints
    # can land in the middle of an answer.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    answers.write(READY)
    answers.flush()
    serve(requests, answers)
    return 0


def serve(requests: BinaryIO, answers: BinaryIO) -> None:
    """Answer requests until the operator closes the pipe."""
    while True:
        head = requests.read(REQUEST.size)
        if len(head) < REQUEST.size:
            return
        size, max_bytes, cpu_s = REQUEST.unpack(head)
        data = requests.read(size)
        if len(data) < size:
            return
        payload = pickle.dumps(parse_limited(data, max_bytes, cpu_s), protocol=pickle.HIGHEST_PROTOCOL)
        answers.write(ANSWER.pack(len(payload)))
        answers.write(payload)
        answers.flush()


def parse_limited(data: bytes, max_bytes: int, cpu_s: float) -> tuple[str, Any]:
    """This parse may use `cpu_s` more seconds of CPU, then SIGXCPU ends the process."""
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
    except Exception as exc:  # a bug, not the graph's fault: its type only, the operator reports it
        return "error", type(exc).__name__


def _limit(memory_bytes: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the operator's to handle
    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_DATA, (memory_bytes, memory_bytes))
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    # When CPUs are short, the operator's loop (its Lease, other namespaces' reconciles) runs
    # first; a parse still gets all the CPU nobody else wants.
    with contextlib.suppress(OSError):
        os.nice(CHILD_NICENESS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
