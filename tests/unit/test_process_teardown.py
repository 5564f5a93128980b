"""A test bed process stopped with SIGTERM still stops what it spawned.

Components run in sessions of their own, so `kill -- -PGID` on a bench or a test run
reaches only the Python process; its etcd, API server and operator lived on until this
was fixed (`processes.interrupt_on_sigterm`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servegraph_testbed import processes

# Starts a `sleep` as a component, stops it at exit as ControlPlane and NodeCluster do,
# prints its pid and waits to be signalled.
CHILD = """
import atexit, sys, time
from pathlib import Path
from servegraph_testbed.processes import Component, stop_at_exit
sleeper = Component("sleeper", ["sleep", "600"], Path(sys.argv[1]))
sleeper.start()
if sys.argv[2] == "handled":
    stop_at_exit(sleeper.stop)
else:
    atexit.register(sleeper.stop)
print(sleeper.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie awaiting its reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _sigterm_child(tmp_path: Path, mode: str) -> tuple[int, int]:
    """(the child's exit status, the pid of the sleep it started), the child SIGTERMed once ready."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path / "sleeper.log"), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
        start_new_session=True,
    )
    try:
        assert child.stdout is not None
        sleeper = int(child.stdout.readline())
        child.send_signal(signal.SIGTERM)
        return child.wait(timeout=30), sleeper
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_sigterm_unwinds_and_stops_the_components(tmp_path: Path) -> None:
    status, sleeper = _sigterm_child(tmp_path, "handled")
    try:
        assert status != -signal.SIGTERM, "killed by the signal: nothing was unwound"
        assert _gone_within(sleeper, 15), "the component outlived the SIGTERMed process"
    finally:
        if _alive(sleeper):
            os.killpg(sleeper, signal.SIGKILL)  # its own session: the group id is its pid


def test_without_it_a_sigterm_leaves_the_components_running(tmp_path: Path) -> None:
    """The control: what the fix is for, so the test above can fail."""
    status, sleeper = _sigterm_child(tmp_path, "default")
    try:
        assert status == -signal.SIGTERM
        assert not _gone_within(sleeper, 1), "a component stopped without the handler: the test above proves nothing"
    finally:
        if _alive(sleeper):
            os.killpg(sleeper, signal.SIGKILL)


def test_a_handler_already_installed_is_kept() -> None:
    def theirs(signum: int, frame: object) -> None:
        raise AssertionError("not called")

    before = signal.signal(signal.SIGTERM, theirs)
    try:
        processes.interrupt_on_sigterm()
        assert signal.getsignal(signal.SIGTERM) is theirs
    finally:
        signal.signal(signal.SIGTERM, before)


def test_the_default_becomes_an_interrupt() -> None:
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        processes.interrupt_on_sigterm()
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # the handler runs between bytecodes, at the latest here
    finally:
        signal.signal(signal.SIGTERM, before)
