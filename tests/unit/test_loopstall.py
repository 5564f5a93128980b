"""LoopStall counts what holds the loop (work on it, a blocking call, a wait for the GIL)
and leaves out the time its thread waited for a CPU, so a test that bounds a stall fails for
the work under test, not for a busy machine."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest

from servegraph_testbed.loopstall import LoopStall


async def test_a_blocking_call_on_the_loop_counts_in_full() -> None:
    async with LoopStall() as stall:
        time.sleep(0.1)  # noqa: ASYNC251  # the stall under test
    assert 90 <= stall.worst_ms < 1000, stall.worst_ms


async def test_work_on_the_loop_counts() -> None:
    async with LoopStall() as stall:
        deadline = time.thread_time() + 0.08
        while time.thread_time() < deadline:
            pass
    assert stall.worst_ms >= 70, stall.worst_ms


async def test_a_thread_that_holds_the_gil_stalls_the_loop() -> None:
    def spin() -> None:
        deadline = time.thread_time() + 0.3
        while time.thread_time() < deadline:
            pass

    sys.setswitchinterval(0.1)  # the GIL handed back every 100 ms, not every 5 ms
    try:
        async with LoopStall() as stall:
            await asyncio.to_thread(spin)
    finally:
        sys.setswitchinterval(0.005)
    assert stall.worst_ms >= 50, stall.worst_ms


async def test_an_idle_loop_shows_no_stall() -> None:
    async with LoopStall() as stall:
        await asyncio.sleep(0.2)
    assert stall.worst_ms < 50, stall.worst_ms


CHILD = """
import asyncio, json, os, time
from servegraph_testbed.loopstall import LoopStall

async def main():
    os.nice(19)  # after the imports, which would crawl at this priority
    gaps, last = [], time.monotonic()
    async def wall():
        nonlocal last
        while True:
            await asyncio.sleep(0.001)
            gaps.append(time.monotonic() - last - 0.001)
            last = time.monotonic()
    watching = asyncio.create_task(wall())
    async with LoopStall() as stall:
        await asyncio.sleep(1.5)
    watching.cancel()
    print(json.dumps({"stall_ms": stall.worst_ms, "wall_ms": max(gaps) * 1000}))

asyncio.run(main())
"""


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="Linux's schedstat")
def test_a_starved_loop_is_not_a_stalled_loop() -> None:
    """An idle loop at nice 19 sharing one CPU with a busy process at nice 0: its wall-clock
    gaps are the scheduler's (long), and LoopStall leaves them out."""
    cpu = min(os.sched_getaffinity(0))
    hog = subprocess.Popen(
        [sys.executable, "-c", "while True: pass"], preexec_fn=lambda: os.sched_setaffinity(0, {cpu})
    )
    try:
        time.sleep(0.2)
        out = subprocess.run(
            [sys.executable, "-c", CHILD],
            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    finally:
        hog.kill()
        hog.wait()
    got = json.loads(out.stdout)
    assert got["wall_ms"] >= 20, f"the busy process never starved the loop: {got}"
    assert got["stall_ms"] < 10, f"a starved loop counted as stalled: {got}"
