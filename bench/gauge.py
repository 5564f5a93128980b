"""How fast this machine runs Python at the moment: a fixed loop, timed in CPU seconds.

The gate scales times by the run's floor, which is mostly the Go API server and etcd at
work. On 2026-11-27 that floor ran as fast as on the baseline's day while the Python
operator spent 25 % more CPU on unchanged code, and a ten-million-add loop took 0.77 to
1.27 s against 0.68 on a quiet day: neighbours on the host slowed Python, not Go. This
gauge puts that reading in every run's results, so a run can be told slow-machine from
regression without timing a loop by hand. It is printed beside the figures, never gated:
no single figure tracked the operator's slowdown closely enough to scale by (BENCHMARKS.md).
"""

from __future__ import annotations

import math
import time

LOOP = 10_000_000


def python_gauge_s(repeats: int = 3) -> float:
    """CPU seconds of the fastest of `repeats` runs of a ten-million-add loop: the least
    disturbed, as a host's neighbours only ever make it slower."""
    best = math.inf
    for _ in range(repeats):
        start = time.process_time()
        total = 0
        for i in range(LOOP):
            total += i
        best = min(best, time.process_time() - start)
    return best
