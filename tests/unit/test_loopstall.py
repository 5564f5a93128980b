"""LoopStall counts what holds the loop (work on it, a blocking call, a wait for the GIL)
and leaves out the time its thread waited for a CPU, so a test that bounds a stall fails for
the work under test, not for a busy machine."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from servegraph_testbed import loopstall
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

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.1)  # the GIL handed back every 100 ms, not every 5 ms
    try:
        async with LoopStall() as stall:
            await asyncio.to_thread(spin)
    finally:
        sys.setswitchinterval(interval)
    assert stall.worst_ms >= 50, stall.worst_ms


async def test_an_idle_loop_shows_no_stall() -> None:
    async with LoopStall() as stall:
        await asyncio.sleep(0.2)
    assert stall.worst_ms < 50, stall.worst_ms


async def test_the_run_queue_wait_in_a_gap_is_left_out(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The kernel's figure stood in by a file: a 100 ms gap of which the thread waited 95 ms
    for a CPU is a 5 ms stall. (By hand on this machine, an idle loop at nice 19 beside a busy
    process on its CPU: 106 ms wall-clock gaps, 0.3 ms stall.)"""
    schedstat = tmp_path / "schedstat"
    schedstat.write_text("0 0 1\n")
    monkeypatch.setattr(loopstall, "SCHEDSTAT", schedstat)
    async with LoopStall() as stall:
        time.sleep(0.1)  # noqa: ASYNC251  # the gap
        schedstat.write_text("5000000 95000000 2\n")  # of which 95 ms runnable, waiting
    assert 3 <= stall.worst_ms < 50, stall.worst_ms


def test_the_kernel_says_how_long_a_thread_waited() -> None:
    """The second field of /proc/thread-self/schedstat, which LoopStall reads, is there here."""
    if not loopstall.SCHEDSTAT.exists():
        pytest.skip("no /proc/thread-self/schedstat: LoopStall falls back to the wall clock")
    fields = loopstall.SCHEDSTAT.read_text().split()
    assert len(fields) == 3 and all(f.isdigit() for f in fields) and int(fields[0]) > 0, fields
