"""`servegraph up` / `down` without a cluster: arguments, waiting, reports and URLs."""

from __future__ import annotations

import argparse
import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from servegraph.cli import deploy as command
from servegraph.raydash import up
from servegraph.raydash.dashboard import AppState, DashboardError, DeploymentState, ServeState, parse_serve_details

ROOT = Path(__file__).resolve().parents[2]
MINI = ROOT / "config" / "samples" / "mini.txtpb"
RECORDED = Path(__file__).parent / "data" / "ray-2.60-serve-applications.json"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="servegraph")
    command.add_arguments(p.add_subparsers(dest="command", required=True))
    return p


def test_registers_up_and_down_with_their_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_DASHBOARD_ADDRESS", raising=False)
    args = parser().parse_args(["up", "graph.txtpb"])
    assert (args.func, args.file, args.address, args.token, args.start_local, args.timeout) == (
        command.run_up,
        Path("graph.txtpb"),
        "http://127.0.0.1:8265",
        None,
        False,
        300.0,
    )
    args = parser().parse_args(["down", "--address", "http://ray:8265", "--token", "t"])
    assert (args.func, args.address, args.token) == (command.run_down, "http://ray:8265", "t")
    args = parser().parse_args(["up", "g.txtpb", "--start-local", "--timeout", "30"])
    assert (args.start_local, args.timeout) == (True, 30.0)


def test_sends_the_parse_of_the_serve_config_v2_string() -> None:
    from servegraph.graph import load_graph
    from servegraph.render.serve_config import serve_config_yaml

    text, config = up.render(MINI)
    assert text == serve_config_yaml(load_graph(MINI), ready=True)
    assert config == yaml.safe_load(text)
    assert [a["name"] for a in config["applications"]] == ["sentiment"]


async def test_an_invalid_graph_deploys_nothing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txtpb"
    bad.write_text('name: "Bad_Name" schema_version: 1\n')
    err = io.StringIO()
    assert await up.up(bad, address="http://127.0.0.1:1", err=err) == 2
    lines = err.getvalue().splitlines()
    assert lines and all(line.startswith(f"error: {bad}: ") for line in lines)
    err = io.StringIO()
    assert await up.up(tmp_path / "missing.txtpb", address="http://127.0.0.1:1", err=err) == 2
    assert "No such file or directory" in err.getvalue()


@pytest.fixture
def closed_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


async def test_no_dashboard_suggests_start_local(closed_port: int) -> None:
    err = io.StringIO()
    assert await up.up(MINI, address=f"http://127.0.0.1:{closed_port}", err=err) == 2
    assert f"no Ray dashboard answers at http://127.0.0.1:{closed_port}" in err.getvalue()
    assert "(add --start-local to start a local Ray head)" in err.getvalue()


async def test_start_local_refuses_remote_addresses() -> None:
    err = io.StringIO()
    # .invalid never resolves (RFC 6761), so nothing answers there.
    code = await up.up(MINI, address="http://ray-head.invalid:8265", start_local=True, err=err)
    assert code == 2
    assert "--start-local only starts one on 127.0.0.1 with an explicit port" in err.getvalue()


async def test_down_reports_an_unreachable_dashboard(closed_port: int) -> None:
    err = io.StringIO()
    assert await up.down(address=f"http://127.0.0.1:{closed_port}", err=err) == 2
    assert err.getvalue().startswith("servegraph down: no Ray dashboard answers")


def app(name: str, status: str, *deployments: tuple[str, str], message: str = "") -> AppState:
    deps = tuple(DeploymentState(name=n, status=s, message=f"{n} says {s}") for n, s in deployments)
    return AppState(name=name, status=status, message=message, route_prefix=f"/{name}", deployments=deps)


def serve(*apps: AppState, port: int | None = 8000) -> ServeState:
    return ServeState(applications={a.name: a for a in apps}, http_host="0.0.0.0", http_port=port)


class Polled:
    """Replays states to `wait_until_running`, one per poll, on a fake clock."""

    def __init__(self, *states: ServeState | Exception) -> None:
        self.states = list(states)
        self.now = 0.0

    async def get_applications(self) -> ServeState:
        self.now += 5.0
        item = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        if isinstance(item, Exception):
            raise item
        return item

    def clock(self) -> float:
        return self.now


async def wait(polled: Polled, names: list[str], timeout_s: float = 60.0) -> tuple[up.Outcome, str]:
    err = io.StringIO()
    outcome = await up.wait_until_running(
        polled,  # type: ignore[arg-type]
        names,
        timeout_s=timeout_s,
        err=err,
        poll_s=0,
        clock=polled.clock,
    )
    return outcome, err.getvalue()


async def test_waits_for_every_app_and_prints_each_change_once() -> None:
    deploying = serve(app("a", "DEPLOYING", ("n1", "UPDATING"), ("n2", "HEALTHY")), app("b", "RUNNING"))
    polled = Polled(
        serve(),
        DashboardError("GET x: 503: the GCS may be down"),
        *[deploying] * 4,
        serve(app("a", "RUNNING", ("n1", "HEALTHY")), app("b", "RUNNING")),
    )
    outcome, progress = await wait(polled, ["a", "b"])
    assert outcome.ok and not outcome.timed_out
    assert progress.splitlines() == [
        "[    5s] a: NOT_STARTED; b: NOT_STARTED",
        "[   10s] dashboard: GET x: 503: the GCS may be down",
        "[   15s] a: DEPLOYING (n1 UPDATING); b: RUNNING",
        "[   30s] a: DEPLOYING (n1 UPDATING); b: RUNNING",  # heartbeat: 15 s without a change
        "[   35s] a: RUNNING; b: RUNNING",
    ]


async def test_keeps_waiting_for_others_after_one_app_fails() -> None:
    failed = app("a", "DEPLOY_FAILED", ("n1", "DEPLOY_FAILED"))
    polled = Polled(serve(failed, app("b", "DEPLOYING")), serve(failed, app("b", "RUNNING")))
    outcome, _ = await wait(polled, ["a", "b"])
    assert not outcome.ok and not outcome.timed_out
    assert outcome.state.applications["b"].status == "RUNNING"


async def test_gives_up_at_the_timeout() -> None:
    outcome, _ = await wait(Polled(serve(app("a", "DEPLOYING"))), ["a"], timeout_s=20)
    assert outcome.timed_out and not outcome.ok


def test_failure_report_names_the_nodes_with_rays_messages() -> None:
    state = parse_serve_details(json.loads(RECORDED.read_text()))
    report = up.failure_report(state, ["sentiment", "scoring", "crashing"], timed_out=False, timeout_s=300)
    assert report == [
        'application "scoring": DEPLOY_FAILED',
        "  Deploying app 'scoring' failed with exception:",
        '  servegraph.runtime.spec.BuildError: node "scorer", field deployment.import_path: '
        "'e2e_apps_missing.models:Scorer': module 'e2e_apps_missing.models' not found "
        "(is it installed in the Ray image or listed in runtime_env?)",
        'application "crashing": DEPLOY_FAILED',
        "  Failed to update the deployments ['embedder'].",
        '  node "embedder": DEPLOY_FAILED (REPLICA_STARTUP_FAILED)',
        "    The deployment failed to start 3 times in a row. This may be due to a problem with its constructor "
        "or initial health check failing. See controller logs for details. Error:",
        "    ValueError: dimensions must be a positive integer, got 0",
    ]


def test_timeout_report_says_so_and_lists_unhealthy_nodes_only() -> None:
    state = serve(app("a", "DEPLOYING", ("ok", "HEALTHY"), ("slow", "UPDATING")))
    report = up.failure_report(state, ["a", "gone"], timed_out=True, timeout_s=30)
    assert report == [
        "servegraph up: not RUNNING after 30s",
        'application "a": DEPLOYING',
        '  node "slow": UPDATING',
        "    slow says UPDATING",
        'application "gone": not reported by Ray',
    ]


@pytest.mark.parametrize(
    ("address", "port", "url"),
    [
        ("http://127.0.0.1:8265", 8000, "http://127.0.0.1:8000/a"),
        ("http://ray-head.ns.svc:8265", 8000, "http://ray-head.ns.svc:8000/a"),
        ("http://[::1]:8265", 8123, "http://[::1]:8123/a"),
        ("http://localhost:8265", None, "http://localhost:8000/a"),
    ],
)
def test_urls_use_the_dashboards_host_and_serves_port(address: str, port: int | None, url: str) -> None:
    assert up.route_urls(serve(app("a", "RUNNING"), port=port), ["a"], address) == [("a", url)]


def test_root_route_prefix() -> None:
    root = AppState(name="r", status="RUNNING", message="", route_prefix="/", deployments=())
    assert up.route_urls(serve(root), ["r"], "http://127.0.0.1:8265") == [("r", "http://127.0.0.1:8000/")]


def test_progress_line_mentions_every_app() -> None:
    line = up.progress_line(serve(app("a", "RUNNING", ("x", "HEALTHY"))), ["a", "b"])
    assert line == "a: RUNNING; b: NOT_STARTED"


def test_run_up_is_what_argparse_dispatches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.txtpb"
    bad.write_text("not a graph {")
    args: Any = parser().parse_args(["up", str(bad), "--address", "http://127.0.0.1:1"])
    assert args.func(args) == 2
    assert capsys.readouterr().err.startswith(f"error: {bad}")
