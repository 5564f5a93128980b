"""Child processes of the control plane: own process group, own log, readiness, teardown.

Every component runs in its own session (so its process group id is its pid) and is
stopped by signalling that group — by pid, never by name — so nothing it spawned
outlives a test run, even when the test fails.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

LOG_TAIL_LINES = 50

# Ports this process has handed out: the kernel may offer a just-closed port again before
# the component that was given it has bound it.
_handed_out: set[int] = set()


class ComponentError(RuntimeError):
    """A component failed to start or to become ready; the message carries its log tail."""

    def __init__(self, component: str, reason: str, log_tail: str) -> None:
        self.component = component
        self.reason = reason
        self.log_tail = log_tail
        super().__init__(f"{component}: {reason}\n--- last {LOG_TAIL_LINES} lines of its log ---\n{log_tail}")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now on `host` (and that this process did not hand out)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port: int = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("no free loopback port found")


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file ('' when it does not exist)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 256 * 1024))
            data = f.read()
    except FileNotFoundError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


# A readiness probe returns (ready, detail); detail is shown when the wait times out.
Probe = Callable[[], tuple[bool, str]]


def http_probe(url: str) -> tuple[bool, str]:
    """Plain-HTTP readiness (etcd /health, controller-runtime /readyz): ready on HTTP 200."""
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:  # noqa: S310 (loopback http)
            return resp.status == 200, resp.read(200).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as e:
        return False, str(e)


class Component:
    """One long-running binary with its log file; start() / wait_ready() / stop()."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and _exit_status(self._proc.pid) is None

    def start(self) -> None:
        """Spawn the process in a new session, appending stdout and stderr to its log."""
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        with self.log_path.open("ab") as log:
            log.write(f"=== {time.strftime('%H:%M:%S')} {' '.join(self.argv)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return tail(self.log_path, lines)

    def error(self, reason: str) -> ComponentError:
        return ComponentError(self.name, reason, self.log_tail())

    def wait_ready(self, probe: Probe, timeout: float) -> None:
        """Poll `probe` until it passes; fail fast with the log tail if the process exits."""
        deadline = time.monotonic() + timeout
        detail = "not probed"
        while True:
            if self._proc is None:
                raise RuntimeError(f"{self.name} was never started")
            status = _exit_status(self._proc.pid)
            if status is not None:
                raise self.error(f"exited ({status}) before becoming ready")
            ready, detail = probe()
            if ready:
                return
            if time.monotonic() > deadline:
                raise self.error(f"not ready after {timeout:.0f} s (last probe: {detail})")
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the process group, no grace (a crash, an OOM kill), and reap the leader."""
        if self._proc is not None:
            _signal_group(self._proc.pid, signal.SIGKILL)
        self.stop()

    def pause(self) -> None:
        """SIGSTOP the process group: it holds its connections and does nothing (a long GC
        pause, a throttled or frozen VM) until `resume`."""
        if self._proc is not None:
            _signal_group(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None:
            _signal_group(self._proc.pid, signal.SIGCONT)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds, and reap the leader.

        The leader is reaped only here and last (everything else checks it with WNOWAIT):
        while it is an unreaped zombie its pid, the group id, cannot be reused, so
        signalling the group can never hit an unrelated process.
        """
        proc, self._proc = self._proc, None
        if proc is None:
            return
        pgid = proc.pid  # start_new_session=True: the group id is the leader's pid
        _signal_group(pgid, signal.SIGTERM)
        _signal_group(pgid, signal.SIGCONT)  # a paused group gets the SIGTERM too
        if not _exited(pgid, grace):
            _signal_group(pgid, signal.SIGKILL)
            _exited(pgid, None)
        _signal_group(pgid, signal.SIGKILL)  # whatever the leader left behind in its group
        proc.wait()


def stop_at_exit(stop: Callable[[], None]) -> None:
    """Run `stop` when this process exits, SIGTERMed included (`interrupt_on_sigterm`): what
    starts components outside any `with` (a control plane, a node) must not outlive it."""
    atexit.register(stop)
    interrupt_on_sigterm()


def interrupt_on_sigterm() -> None:
    """Make SIGTERM a KeyboardInterrupt in this process, unless something already handles it.

    SIGTERM's default ends a process at once: no `finally`, no `with`, no atexit. Components
    run in sessions of their own, out of that signal's reach, so a bench stopped with
    `kill -- -PGID` left its etcd, API server and operator running (2026-11-27). As a
    KeyboardInterrupt the teardowns run, and pytest ends the session (a SystemExit would fail
    one test and go on to the next). Signal handlers can be set only from the main thread; a
    handler someone else installed (an event loop's, a CLI's own) is theirs to keep.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def _exit_status(pid: int) -> str | None:
    """'exit code N' / 'killed by signal N' once `pid` has exited, else None; never reaps."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    if info is None or info.si_pid == 0:
        return None
    if info.si_code == os.CLD_EXITED:
        return f"exit code {info.si_status}"
    return f"killed by signal {info.si_status}"


def _exited(pid: int, timeout: float | None) -> bool:
    """Wait until `pid` has exited, without reaping it."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if _exit_status(pid) is not None:
            return True
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(0.02)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
