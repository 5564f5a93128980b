"""The collector pause restores what it found, even when the work raises."""

from __future__ import annotations

import gc

import pytest

from servegraph.gcpause import gc_paused


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
