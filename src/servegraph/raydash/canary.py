"""`servegraph canary`, `promote` and `abort` on a plain Ray cluster (what `servegraph up` deployed).

A plain cluster keeps no state but the Serve config it runs, so each command reads that
config back through the dashboard (each application's `deployed_app_config`, what KubeRay
reads too), lets `render/canary.py` lay out the next one, PUTs it and waits until every
application is RUNNING. Promote and abort take two PUTs: first the routes move (the retiring
side application still answers what is in flight), then, once RUNNING, it is removed.
Exit codes as `up`'s: 0 done, 1 not RUNNING in time, 2 refused or unreachable.
"""

from __future__ import annotations

import asyncio
import secrets
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TextIO

from servegraph.graph import GraphError, decode_file, load_graph
from servegraph.graph.validate import to_model
from servegraph.raydash import DEFAULT_ADDRESS, DEFAULT_TIMEOUT_S
from servegraph.raydash.dashboard import DashboardError, RayDashboard, ServeState, resolve_token
from servegraph.raydash.up import failure_report, wait_until_running
from servegraph.render import canary as layouts
from servegraph.render.canary import CanaryRefused, CanaryState, Split
from servegraph.render.serve_config import render_serve_config

TOP_LEVEL = ("proxy_location", "http_options", "grpc_options")


class Refused(Exception):
    """The command cannot do what it was asked; the message says why, in one line."""


@dataclass(frozen=True)
class Target:
    """Where and how to reach the cluster."""

    address: str = DEFAULT_ADDRESS
    token: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S


def deployed_config(state: ServeState) -> dict[str, Any]:
    """The Serve config a cluster runs, as far as the dashboard says it: every application's
    deployed config, and Serve's own options as it runs them."""
    apps = [dict(a.deployed_app_config) for a in state.applications.values() if a.deployed_app_config]
    if not apps:
        raise Refused("no application runs there: `servegraph up` a graph first")
    config: dict[str, Any] = {"proxy_location": "EveryNode"}
    if state.http_port is not None:
        config["http_options"] = {"host": state.http_host or "0.0.0.0", "port": state.http_port}  # noqa: S104
    if state.grpc_port is not None:
        config["grpc_options"] = {
            "port": state.grpc_port,
            "grpc_servicer_functions": list(state.grpc_servicer_functions),
        }
    config["applications"] = apps
    return config


def new_version(path: Path, data: bytes | None, running: Mapping[str, Any], state: ServeState) -> dict[str, Any]:
    """The graph at `path`, rendered ready for a canary, with the running Serve's own options
    (Serve takes them only when it starts); Refused when it needs gRPC servicers Serve lacks."""
    graph = load_graph(path) if data is None else to_model(decode_file(data, ""))
    rendered = layouts.ready(render_serve_config(graph))
    missing = sorted(set(rendered["grpc_options"]["grpc_servicer_functions"]) - set(state.grpc_servicer_functions))
    if missing:
        raise Refused(f"it needs the gRPC servicer {missing[0]}, which Serve there was started without")
    return {**{k: running[k] for k in TOP_LEVEL if k in running}, "applications": rendered["applications"]}


async def _apply(dash: RayDashboard, config: Mapping[str, Any], target: Target, err: TextIO) -> bool:
    """PUT `config`, wait until its applications are RUNNING and the ones it drops are gone
    (Serve lets their requests in flight finish first)."""
    await dash.put_applications(config)
    names = [str(a["name"]) for a in config["applications"]]
    started = time.monotonic()
    outcome = await wait_until_running(dash, names, timeout_s=target.timeout_s, err=err)
    if not outcome.ok:
        for line in failure_report(outcome.state, names, timed_out=outcome.timed_out, timeout_s=target.timeout_s):
            print(line, file=err)
        return False
    while set(outcome.state.applications) - set(names):
        if time.monotonic() - started > target.timeout_s:
            gone = ", ".join(sorted(set(outcome.state.applications) - set(names)))
            print(f"not removed after {target.timeout_s:g}s: {gone}", file=err)
            return False
        await asyncio.sleep(0.5)
        outcome = replace(outcome, state=await dash.get_applications())
    return True


async def _read(dash: RayDashboard) -> tuple[ServeState, dict[str, Any], CanaryState]:
    state = await dash.get_applications()
    running = deployed_config(state)
    try:
        return state, running, layouts.read(running)
    except ValueError as e:
        raise Refused(f"the running config is not one servegraph laid out: {e}") from None


async def start(
    path: Path,
    split: Split,
    target: Target,
    *,
    data: bytes | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Start (or re-weigh) a canary of the graph at `path` beside what runs."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        async with RayDashboard(target.address, resolve_token(target.token)) as dash:
            state, running, current = await _read(dash)
            new = new_version(path, data, running, state)
            version = layouts.version_of(new)
            if current.canary is not None and current.canary_version != version:
                raise Refused(f"a canary of version {current.canary_version} runs: promote or abort it first")
            if current.canary is None and version == current.live_version:
                raise Refused(f"version {version} already serves as live")
            token = (
                current.split.stats if current.split is not None and current.split.stats else secrets.token_urlsafe(18)
            )
            split = Split(split.weight, split.mirror, split.sticky_header, split.sticky_field, token)
            config = layouts.layout(current.base, current.live, new, split, keep=_retiring(current))
            print(f"servegraph canary: version {version} at {split.weight}% beside {current.live_version}", file=err)
            if not await _apply(dash, config, target, err):
                return 1
    except (Refused, CanaryRefused, DashboardError, GraphError, ValueError) as e:
        return _refused("canary", e, err)
    sides = layouts.read(config).side_apps
    for app, roles in sorted(sides.items()):
        if "canary" in roles:
            print(f"{app}: canary copies in {roles['canary']}", file=out)
    print(f"stats: x-servegraph-stats: {split.stats}", file=out)
    return 0


def _retiring(state: CanaryState) -> list[Mapping[str, Any]]:
    return [state.deployed[k] for k in state.retiring]


async def finish(promote: bool, target: Target, *, err: TextIO | None = None) -> int:
    """Promote the running canary (it alone serves, nothing of it restarts) or abort it."""
    err = err or sys.stderr
    command = "promote" if promote else "abort"
    try:
        async with RayDashboard(target.address, resolve_token(target.token)) as dash:
            _, running, current = await _read(dash)
            if current.canary is None:
                raise Refused("no canary runs there")
            step = layouts.promoted(running, drain=True) if promote else layouts.aborted(running, drain=True)
            if not await _apply(dash, step, target, err):
                return 1
            settled = layouts.settled(step)
            gone = sorted({a["name"] for a in step["applications"]} - {a["name"] for a in settled["applications"]})
            if gone and not await _apply(dash, settled, target, err):
                return 1
    except (Refused, CanaryRefused, DashboardError, ValueError) as e:
        return _refused(command, e, err)
    what = (
        f"version {current.canary_version} serves alone" if promote else f"version {current.live_version} serves alone"
    )
    print(f"servegraph {command}: {what}" + (f"; removed {', '.join(gone)}" if gone else ""), file=err)
    return 0


def _refused(command: str, e: Exception, err: TextIO) -> int:
    if isinstance(e, GraphError):
        for problem in e.problems:
            print(f"error: {problem}", file=err)
    else:
        print(f"servegraph {command}: {e}", file=err)
    return 2
