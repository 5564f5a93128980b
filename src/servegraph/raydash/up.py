"""`servegraph up` / `servegraph down`: a graph file straight onto a Ray cluster.

`up` renders the Serve config with the operator's renderer and sends exactly
the parsed serveConfigV2 string through the dashboard's REST API — the same
document and the same endpoint KubeRay uses — so what works here works in a
RayService. Exit codes: 0 running, 1 failed or timed out, 2 nothing deployed
(invalid graph, no dashboard, auth refused).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlsplit

import yaml

from servegraph.dag import model
from servegraph.graph import GraphError, decode_file, load_graph
from servegraph.graph.servicers import GRAPH_SERVICE_SERVICER
from servegraph.graph.validate import to_model
from servegraph.raydash import DEFAULT_ADDRESS, DEFAULT_TIMEOUT_S, capacity
from servegraph.raydash.dashboard import (
    AppState,
    DashboardError,
    DashboardUnreachable,
    RayDashboard,
    ServeState,
    resolve_token,
    summarize_message,
)
from servegraph.raydash.local import ensure_dashboard
from servegraph.render.serve_config import SERVE_GRPC_PORT, SERVE_HTTP_PORT, serve_config_yaml

FAILED = frozenset({"DEPLOY_FAILED", "UNHEALTHY"})
_HEARTBEAT_S = 15.0


def render(
    path: Path, *, http_port: int = SERVE_HTTP_PORT, grpc_port: int = SERVE_GRPC_PORT
) -> tuple[str, dict[str, Any]]:
    """The serveConfigV2 string for the graph at `path`, and the config `up` sends: its parse.

    Sending the parse of the very string the operator puts in a RayService (of a
    ServeGraph with canaries on: ready for one) is what makes `up` and the operator
    deploy the same thing; only the ports may differ, for a machine where the
    defaults are taken.
    """
    return _render(load_graph(path), http_port=http_port, grpc_port=grpc_port)


def _render(graph: model.Graph, *, http_port: int, grpc_port: int) -> tuple[str, dict[str, Any]]:
    """Ready for a canary (`render.canary.ready`: fixed replicas written as a pinned
    autoscaling_config), so `servegraph canary` can later run a version beside it without
    restarting what runs."""
    text = serve_config_yaml(graph, http_port=http_port, grpc_port=grpc_port, ready=True)
    return text, yaml.safe_load(text)


async def up(
    path: Path,
    *,
    address: str = DEFAULT_ADDRESS,
    token: str | None = None,
    start_local: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    http_port: int = SERVE_HTTP_PORT,
    grpc_port: int = SERVE_GRPC_PORT,
    out: TextIO | None = None,
    err: TextIO | None = None,
    data: bytes | None = None,
) -> int:
    """Serve applies the ports only when it starts: on a cluster where it runs, they stay
    what they were (the printed URLs say Serve's real HTTP port). `data`: the graph's bytes
    when they come from stdin, `path` then only names them."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        graph = load_graph(path) if data is None else to_model(decode_file(data, ""))
        _, config = _render(graph, http_port=http_port, grpc_port=grpc_port)
    except GraphError as e:
        for problem in e.problems:  # the CLI's format: one problem a line
            print(f"error: {path}: {problem}", file=err)
        return 2
    except OSError as e:
        print(f"servegraph up: {path}: {e.strerror or e}", file=err)
        return 2

    want = capacity.needs(graph)
    try:
        token = await ensure_dashboard(
            address,
            resolve_token(token),
            start_local=start_local,
            err=err,
            head_flags=capacity.local_head_flags(want, os.cpu_count() or 1),
        )
        async with RayDashboard(address, token) as dash:
            short = capacity.shortfall(want, await _alive_resources(dash))
            if short:
                for line in short:
                    print(f"servegraph up: {line}; nothing deployed", file=err)
                print(f"servegraph up: {_bigger(short, start_local)}", file=err)
                return 2
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
    print(grpc_line(outcome.state, graph_service_apps(graph), address), file=err)
    return 0


NODES_WAIT_S = 15.0
"""How long a head that answers but lists no node with resources yet (just started) is given."""


async def _alive_resources(dash: RayDashboard) -> list[Mapping[str, float]]:
    """The live nodes' resources; a head that answers before its own raylet registered lists
    none for a moment (seen: `up` right after `ray start` refused a graph, "the cluster has
    0 CPU"), so an empty list is read again for a while before it is believed."""
    deadline = asyncio.get_running_loop().time() + NODES_WAIT_S
    while True:
        found = capacity.alive_resources(await dash.nodes())
        if any(found) or asyncio.get_running_loop().time() >= deadline:
            return found
        await asyncio.sleep(0.5)


def _bigger(short: Sequence[str], start_local: bool) -> str:
    """What to do about a cluster that is too small."""
    gpus = any(" GPU" in line for line in short)
    if start_local and not gpus:
        return "a Ray head already runs there: `ray stop`, then `up --start-local` starts one sized for the graph"
    return (
        "deploy to a larger cluster (--address), or start Ray with room for it "
        "(`ray start --head --num-cpus N --num-gpus N --memory BYTES`)"
    )


async def down(*, address: str = DEFAULT_ADDRESS, token: str | None = None, err: TextIO | None = None) -> int:
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


def graph_service_apps(graph: model.Graph) -> list[str]:
    """The applications to offer for GraphService: every one (a router or a class at the
    ingress answers it; only a function deployment there cannot, which is not known
    without importing it), those with a router ingress first."""
    routed = [a.name for a in graph.applications if not isinstance(a.nodes[a.ingress].kind, model.DeploymentKind)]
    return routed + [a.name for a in graph.applications if a.name not in routed]


def grpc_line(state: ServeState, app_names: Sequence[str], address: str) -> str:
    """How to call the graph over gRPC (`app_names`: the applications that answer it), or
    why not: Serve takes its gRPC options only when it starts, so a cluster whose Serve
    started without GraphService serves HTTP alone until Serve restarts."""
    if GRAPH_SERVICE_SERVICER not in state.grpc_servicer_functions or state.grpc_port is None:
        return (
            "gRPC: not served: Serve was already running on this cluster without servegraph's GraphService "
            "(it takes gRPC options only when it starts; `servegraph down`, then `up` again)"
        )
    if not app_names:
        return "gRPC: the graph has no application to call"
    host = urlsplit(address).hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"gRPC: servegraph call --grpc {host}:{state.grpc_port} --app {app_names[0]} PAYLOAD_JSON"


def _app_names(config: Mapping[str, Any]) -> list[str]:
    return [str(app["name"]) for app in config.get("applications", [])]


def _app_list(config: Mapping[str, Any]) -> str:
    names = _app_names(config)
    return f"application{'s' if len(names) != 1 else ''} {', '.join(names)}"
