"""`servegraph up --start-local`: a Ray head on this machine when no dashboard answers.

Started with the `ray` CLI of servegraph's own environment (so versions match)
and token authentication on, the way a local `ray.init()` sets it up.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit

from servegraph.raydash.dashboard import DashboardError, DashboardUnreachable, RayDashboard

_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


async def ensure_dashboard(
    address: str, token: str | None, *, start_local: bool, err: TextIO, head_flags: Sequence[str] = ()
) -> str | None:
    """Return the token to use once a dashboard answers at `address`, starting a local head
    (with `head_flags` for `ray start`) if asked."""
    try:
        async with RayDashboard(address, token) as dash:
            await dash.version()
        return token
    except DashboardUnreachable:
        if not start_local:
            raise
    parts = urlsplit(address)
    if parts.hostname not in _LOOPBACK or parts.port is None:
        raise DashboardUnreachable(
            f"no Ray dashboard answers at {address}, and --start-local only starts one on "
            "127.0.0.1 with an explicit port"
        )
    token = await start_local_head(parts.port, token, err=err, flags=head_flags)
    async with RayDashboard(address, token) as dash:
        await _wait_for_dashboard(dash)
    return token


async def start_local_head(
    dashboard_port: int, token: str | None, *, err: TextIO, flags: Sequence[str] = ()
) -> str | None:
    """`ray start --head` with this environment's Ray, token auth on unless RAY_AUTH_MODE says otherwise.

    The head outlives this command (that is the point); `ray stop` ends it.
    Returns the token the head accepts.
    """
    ray = _ray_command()
    env = dict(os.environ)
    if env.get("RAY_AUTH_MODE", "token").lower() == "token":
        env["RAY_AUTH_MODE"] = "token"
        if token:
            env["RAY_AUTH_TOKEN"] = token  # the head and its workers use the caller's token
        else:
            # Ray's own way: reuse ~/.ray/auth_token or create it, as a local ray.init() does.
            code, stdout, _ = await _run([*ray, "get-auth-token", "--generate"], env)
            if code != 0 or not stdout.strip():
                raise DashboardError("could not create a Ray auth token with `ray get-auth-token --generate`")
            token = stdout.strip()
    sized = f" with {' '.join(flags)} (the graph's needs; Ray counts them logically)" if flags else ""
    print(
        f"servegraph up: starting a local Ray head{sized}, dashboard on 127.0.0.1:{dashboard_port} "
        "(stop it with `ray stop`)",
        file=err,
        flush=True,
    )
    command = [
        *ray,
        "start",
        "--head",
        f"--dashboard-port={dashboard_port}",
        "--disable-usage-stats",
        *flags,
    ]
    code, stdout, stderr = await _run(command, env)
    if code != 0:
        output = "\n".join(s for s in (stdout, stderr) if s.strip())
        if token:
            output = output.replace(token, "<token>")
        raise DashboardError(f"`ray start --head` failed with exit code {code}:\n{output.strip()}")
    return token


async def _wait_for_dashboard(dash: RayDashboard, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await dash.version()
            return
        except DashboardUnreachable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)


def _ray_command() -> list[str]:
    """The `ray` CLI of the interpreter running servegraph, so versions match."""
    beside = Path(sys.executable).with_name("ray")
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "ray.scripts.scripts"]


async def _run(command: list[str], env: Mapping[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *command,
        env=dict(env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await proc.communicate()
    return proc.returncode or 0, stdout.decode(errors="replace"), stderr.decode(errors="replace")
