"""A throwaway local Ray head for the e2e suite, owned and ended by process session.

`ray start --head --block` runs as the leader of a new session; every Ray
process it spawns (GCS, raylet, dashboard, workers, Serve replicas) inherits
that session id even when it makes its own process group. Teardown signals
exactly those pids — never processes found by name — and verifies none is
left.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RAY = Path(sys.executable).with_name("ray")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def session_pids(sid: int) -> list[int]:
    """Live (non-zombie) processes whose session id is `sid`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command: state ppid pgrp session ...
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[3]) == sid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


@dataclass
class RayHead:
    num_cpus: int = 2
    extra_env: dict[str, str] = field(default_factory=dict)
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    dashboard_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    """Ray's metrics agent: Prometheus text of Ray's and the application's metrics."""
    temp_dir: Path = field(init=False)
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)
    log_path: Path = field(init=False)

    @property
    def address(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def start(self, timeout_s: float = 180.0) -> None:
        # Short: Ray puts unix sockets under it (108-byte path limit).
        self.temp_dir = Path(tempfile.mkdtemp(prefix="sg", dir="/tmp"))
        self.log_path = self.temp_dir / "head.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(
            RAY_AUTH_MODE="token",
            RAY_AUTH_TOKEN=self.token,
            RAY_USAGE_STATS_ENABLED="0",
        )
        env.update(self.extra_env)
        command = [
            str(RAY),
            "start",
            "--head",
            "--block",
            f"--num-cpus={self.num_cpus}",
            "--num-gpus=0",
            f"--port={free_port()}",
            f"--dashboard-port={self.dashboard_port}",
            "--dashboard-host=127.0.0.1",
            f"--ray-client-server-port={free_port()}",
            f"--dashboard-agent-listen-port={free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            f"--metrics-export-port={self.metrics_port}",
            f"--temp-dir={self.temp_dir}",
            "--include-log-monitor=false",
            "--disable-usage-stats",
        ]
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            self._wait_for_dashboard(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_for_dashboard(self, timeout_s: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        request = urllib.request.Request(
            f"{self.address}/api/ray/version",
            headers={"x-ray-authorization": f"Bearer {self.token}"},
        )
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(request, timeout=5) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"Ray dashboard not up after {timeout_s}s:\n{self.log()}")
            time.sleep(1.0)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> list[int]:
        """End the head and everything in its session; return pids that survived (should be none)."""
        if self.proc is None:
            return []
        survivors = end_session(self.proc)
        if not survivors:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        return survivors


@contextlib.contextmanager
def running_head(**options: Any) -> Iterator[RayHead]:
    """A started head, stopped on leaving even when a test failed; fails if a process survived."""
    head = RayHead(**options)
    head.start()
    try:
        yield head
    finally:
        survivors = head.stop()
        assert not survivors, f"Ray processes survived teardown: {survivors}"


def end_session(leader: subprocess.Popen[bytes], wait_s: float = 5.0) -> list[int]:
    """SIGTERM, then SIGKILL, every process in the session `leader` started; return survivors.

    Most Ray processes exit on SIGTERM at once; the raylet (and `ray start
    --block` waiting for it) can take longer than a test suite should, and its
    state dies with the session anyway, hence the short grace.
    """
    sid = leader.pid
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in session_pids(sid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while session_pids(sid) and time.monotonic() < deadline:
            leader.poll()  # reap the leader once it exits
            time.sleep(0.2)
        if not session_pids(sid):
            break
    with contextlib.suppress(subprocess.TimeoutExpired):
        leader.wait(timeout=5)
    return session_pids(sid)
