"""`servegraph up` / `servegraph down`: a graph file straight onto a Ray cluster.

`up` renders the Serve config with the operator's renderer and sends exactly
the parsed serveConfigV2 string through the dashboard's REST API — the same
document and the same endpoint KubeRay uses — so what works here works in a
RayService. Exit codes: 0 running, 1 failed or timed out, 2 nothing deployed
(invalid graph, no dashboard, auth refused).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import urlsplit

if TYPE_CHECKING:  # aiohttp and the renderer load only when a command runs
    from servegraph.raydash import AppState, RayDashboard, ServeState

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
DEFAULT_TIMEOUT_S = 300.0
FAILED = frozenset({"DEPLOY_FAILED", "UNHEALTHY"})
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_HEARTBEAT_S = 15.0


def add_arguments(subparsers: Any) -> None:
    """Register `up` and `down` on the CLI's subparsers (an argparse `_SubParsersAction`)."""
    up = subparsers.add_parser(
        "up",
        help="deploy a graph onto a Ray cluster through its dashboard",
        description="Render FILE's Serve config (the operator's serveConfigV2), PUT it to the Ray "
        "dashboard, wait until every application is RUNNING and print their URLs.",
    )
    up.add_argument("file", type=Path, help="graph file (.txtpb, .pb, .json)")
    _connection_arguments(up)
    up.add_argument(
        "--start-local",
        action="store_true",
        help="start a local Ray head (with token auth) if no dashboard answers at --address",
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds to wait for RUNNING (default %(default)g)",
    )
    up.set_defaults(func=run_up)

    down = subparsers.add_parser(
        "down",
        help="remove the Serve applications from a Ray cluster",
        description="DELETE the cluster's Serve applications (Ray shuts Serve down; the Ray cluster keeps running).",
    )
    _connection_arguments(down)
    down.set_defaults(func=run_down)


def _connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address",
        default=os.environ.get("RAY_DASHBOARD_ADDRESS", DEFAULT_ADDRESS),
        help="Ray dashboard URL (default $RAY_DASHBOARD_ADDRESS or %(default)s)",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="Ray auth token; prefer $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token "
        "(command lines are visible to other users)",
    )


def run_up(args: argparse.Namespace) -> int:
    return asyncio.run(
        up(
            args.file,
            address=args.address,
            token=args.token,
            start_local=args.start_local,
            timeout_s=args.timeout,
        )
    )


def run_down(args: argparse.Namespace) -> int:
    return asyncio.run(down(address=args.address, token=args.token))


def render(path: Path) -> tuple[str, dict[str, Any]]:
    """The serveConfigV2 string for the graph at `path`, and the config `up` sends: its parse.

    Sending the parse of the very string the operator puts in a RayService is
    what makes `up` and the operator deploy the same thing.
    """
    import yaml

    from servegraph.graph import load_graph
    from servegraph.render.serve_config import serve_config_yaml

    text = serve_config_yaml(load_graph(path))
    return text, yaml.safe_load(text)


async def up(
    path: Path,
    *,
    address: str = DEFAULT_ADDRESS,
    token: str | None = None,
    start_local: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    from servegraph.graph import GraphError
    from servegraph.raydash import DashboardError, DashboardUnreachable, RayDashboard, resolve_token

    out, err = out or sys.stdout, err or sys.stderr
    try:
        _, config = render(path)
    except GraphError as e:
        for problem in e.problems:  # the CLI's format: one problem a line
            print(f"error: {path}: {problem}", file=err)
        return 2
    except OSError as e:
        print(f"servegraph up: {path}: {e.strerror or e}", file=err)
        return 2

    try:
        token = await ensure_dashboard(address, resolve_token(token), start_local=start_local, err=err)
        async with RayDashboard(address, token) as dash:
            print(f"servegraph up: deploying {_app_list(config)} to {address}", file=err, flush=True)
            await dash.put_applications(config)
            outcome = await wait_until_running(dash, _app_names(config), timeout_s=timeout_s, err=err)
    except DashboardUnreachable as e:
        hint = "" if start_local else " (add --start-local to start a local Ray head)"
        print(f"servegraph up: {e}{hint}", file=err)
        return 2
    except DashboardError as e:
        print(f"servegraph up: {e}", file=err)
        return 2

    if not outcome.ok:
        for line in failure_report(outcome.state, _app_names(config), timed_out=outcome.timed_out, timeout_s=timeout_s):
            print(line, file=err)
        return 1
    for name, url in route_urls(outcome.state, _app_names(config), address):
        print(f"{name}: {url}", file=out)
    return 0


async def down(*, address: str = DEFAULT_ADDRESS, token: str | None = None, err: TextIO | None = None) -> int:
    from servegraph.raydash import DashboardError, RayDashboard, resolve_token

    err = err or sys.stderr
    try:
        async with RayDashboard(address, resolve_token(token)) as dash:
            names = sorted((await dash.get_applications()).applications)
            await dash.delete_applications()
    except DashboardError as e:
        print(f"servegraph down: {e}", file=err)
        return 2
    print(f"servegraph down: removed {', '.join(names) or 'no applications'} from {address}", file=err)
    return 0


@dataclass(frozen=True)
class Outcome:
    ok: bool
    timed_out: bool
    state: ServeState


async def wait_until_running(
    dash: RayDashboard,
    app_names: Sequence[str],
    *,
    timeout_s: float,
    err: TextIO,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> Outcome:
    """Poll until every app is RUNNING or failed (DEPLOY_FAILED/UNHEALTHY), or time runs out.

    Waiting for every app to settle, not just the first failure, lets one run
    report every broken node. Prints a line whenever the picture changes, and a
    heartbeat while it does not, so a slow image pull does not look like a hang.
    """
    from servegraph.raydash import DashboardError, ServeState

    start = clock()
    state = ServeState(applications={}, http_host=None, http_port=None)
    last_line, last_print = "", start
    while True:
        try:
            state = await dash.get_applications()
            line = progress_line(state, app_names)
        except DashboardError as e:  # e.g. 503 while the GCS restarts: keep polling until the deadline
            line = f"dashboard: {e}"
        now = clock()
        if line != last_line or now - last_print >= _HEARTBEAT_S:
            print(f"[{now - start:5.0f}s] {line}", file=err, flush=True)
            last_line, last_print = line, now
        statuses = [_status(state, name) for name in app_names]
        if all(s == "RUNNING" or s in FAILED for s in statuses):
            return Outcome(ok=all(s == "RUNNING" for s in statuses), timed_out=False, state=state)
        if now - start >= timeout_s:
            return Outcome(ok=False, timed_out=True, state=state)
        await asyncio.sleep(poll_s)


def _status(state: ServeState, app: str) -> str:
    found = state.applications.get(app)
    return found.status if found else "NOT_STARTED"


def progress_line(state: ServeState, app_names: Sequence[str]) -> str:
    """One line for all apps: `app: STATUS (node STATUS, ...)`, nodes shown while not healthy."""
    parts = []
    for name in app_names:
        app = state.applications.get(name)
        if app is None:
            parts.append(f"{name}: NOT_STARTED")
            continue
        pending = [f"{d.name} {d.status}" for d in app.deployments if d.status != "HEALTHY"]
        parts.append(f"{name}: {app.status}" + (f" ({', '.join(pending)})" if pending else ""))
    return "; ".join(parts)


def failure_report(state: ServeState, app_names: Sequence[str], *, timed_out: bool, timeout_s: float) -> list[str]:
    """What Ray says about every app that is not RUNNING, naming each failing node."""
    from servegraph.raydash import summarize_message

    lines = []
    if timed_out:
        lines.append(f"servegraph up: not RUNNING after {timeout_s:g}s")
    for name in app_names:
        app: AppState | None = state.applications.get(name)
        if app is None:
            lines.append(f'application "{name}": not reported by Ray')
            continue
        if app.status == "RUNNING":
            continue
        lines.append(f'application "{name}": {app.status}')
        lines += _indent(summarize_message(app.message))
        for dep in app.deployments:
            if dep.status == "HEALTHY":
                continue
            why = f" ({dep.status_trigger})" if dep.status_trigger else ""
            # The deployment name is the node id: that is what the graph author knows.
            lines.append(f'  node "{dep.name}": {dep.status}{why}')
            lines += _indent(summarize_message(dep.message), "    ")
    return lines


def _indent(text: str, prefix: str = "  ") -> list[str]:
    return [prefix + line for line in text.splitlines() if line.strip()]


def route_urls(state: ServeState, app_names: Sequence[str], address: str) -> list[tuple[str, str]]:
    """Each app's URL: the dashboard's host (Serve's proxy runs on the head too) and Serve's HTTP port."""
    host = urlsplit(address).hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    port = state.http_port or 8000
    urls = []
    for name in app_names:
        app = state.applications.get(name)
        prefix = (app.route_prefix if app else None) or "/"
        urls.append((name, f"http://{host}:{port}{prefix}"))
    return urls


def _app_names(config: Mapping[str, Any]) -> list[str]:
    return [str(app["name"]) for app in config.get("applications", [])]


def _app_list(config: Mapping[str, Any]) -> str:
    names = _app_names(config)
    return f"application{'s' if len(names) != 1 else ''} {', '.join(names)}"


async def ensure_dashboard(address: str, token: str | None, *, start_local: bool, err: TextIO) -> str | None:
    """Return the token to use once a dashboard answers at `address`, starting a local head if asked."""
    from servegraph.raydash import DashboardUnreachable, RayDashboard

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
    token = await start_local_head(parts.port, token, err=err)
    async with RayDashboard(address, token) as dash:
        await _wait_for_dashboard(dash)
    return token


async def start_local_head(dashboard_port: int, token: str | None, *, err: TextIO) -> str | None:
    """`ray start --head` with this environment's Ray, token auth on unless RAY_AUTH_MODE says otherwise.

    The head outlives this command (that is the point); `ray stop` ends it.
    Returns the token the head accepts.
    """
    from servegraph.raydash import DashboardError

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
    print(
        f"servegraph up: starting a local Ray head, dashboard on 127.0.0.1:{dashboard_port} (stop it with `ray stop`)",
        file=err,
        flush=True,
    )
    command = [
        *ray,
        "start",
        "--head",
        f"--dashboard-port={dashboard_port}",
        "--disable-usage-stats",
    ]
    code, stdout, stderr = await _run(command, env)
    if code != 0:
        output = "\n".join(s for s in (stdout, stderr) if s.strip())
        if token:
            output = output.replace(token, "<token>")
        raise DashboardError(f"`ray start --head` failed with exit code {code}:\n{output.strip()}")
    return token


async def _wait_for_dashboard(dash: RayDashboard, timeout_s: float = 120.0) -> None:
    from servegraph.raydash import DashboardUnreachable

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
