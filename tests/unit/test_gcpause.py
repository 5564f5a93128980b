"""The collector pause restores what it found, even when the work raises; a service's start-up
is frozen out of the collector's way and its youngest generation collected less often; the
clock counts each run of the collector and its CPU, by generation."""

from __future__ import annotations

import gc

import pytest

from servegraph.gcpause import CLOCK, SERVICE_THRESHOLDS, CollectorClock, gc_paused, tune_for_service


@gc_paused
def _state() -> bool:
    return gc.isenabled()


@gc_paused
def _fail() -> None:
    raise RuntimeError("boom")


def test_paused_inside_and_restored_after() -> None:
    assert gc.isenabled()
    assert _state() is False
    assert gc.isenabled()


def test_restored_when_the_work_raises() -> None:
    with pytest.raises(RuntimeError, match="boom"):
        _fail()
    assert gc.isenabled()


def test_a_caller_that_disabled_the_collector_keeps_it_disabled() -> None:
    gc.disable()
    try:
        assert _state() is False
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_service_freezes_its_start_up_and_collects_less_often() -> None:
    before = gc.get_threshold()
    kept: dict[str, object] = {"start-up": []}
    try:
        tune_for_service()
        assert gc.get_threshold() == SERVICE_THRESHOLDS and SERVICE_THRESHOLDS[0] > before[0]
        assert gc.get_freeze_count() > 0
        assert not any(kept is o for o in gc.get_objects()), "start-up objects are left out of collections"
        later: dict[str, object] = {"after": []}
        assert any(later is o for o in gc.get_objects()), "what comes later is collected as before"
        assert gc.isenabled()
        assert CLOCK._tick in gc.callbacks, "and its collections are counted from then on"
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
        CLOCK.stop()


def _cycles(n: int) -> None:
    for _ in range(n):
        a: list[object] = []
        a.append(a)


def test_the_clock_counts_each_run_of_a_generation_once_with_its_cpu() -> None:
    clock = CollectorClock()
    clock.start()
    clock.start()  # a second start adds no second callback
    gc.disable()  # no run but the ones made here
    try:
        _cycles(50_000)
        gc.collect(2)
        gc.collect(0)
        assert clock.collections == [1, 0, 1]
        assert clock.seconds[2] > 0 and clock.seconds[1] == 0
        clock.stop()
        gc.collect(2)
        assert clock.collections == [1, 0, 1], "stopped: no longer counted"
    finally:
        gc.enable()
        clock.stop()
