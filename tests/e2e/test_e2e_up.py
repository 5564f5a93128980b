"""`servegraph up` / `down` against the real dashboard: failures name nodes, samples serve, tokens stay secret."""

from __future__ import annotations

import io
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from e2e_support import GRAPHS, SAMPLES, request, start_serve
from rayhead import RayHead, end_session, free_port, session_pids

from servegraph.raydash import capacity, up
from servegraph.raydash.dashboard import DashboardError, RayDashboard
from servegraph.v1 import graph_pb2

SERVEGRAPH = Path(sys.executable).with_name("servegraph")


async def test_up_reports_failed_applications_naming_the_node(ray_head: RayHead, serve_port: int) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = await up.up(
        GRAPHS / "broken.txtpb", address=ray_head.address, token=ray_head.token, timeout_s=240, out=out, err=err
    )
    report = err.getvalue()
    assert code == 1, report
    assert out.getvalue() == ""
    # The import path cannot resolve: the build fails and the builder's message names the node.
    assert 'application "scoring": DEPLOY_FAILED' in report
    assert 'node "scorer", field deployment.import_path' in report
    assert "module 'e2e_apps_missing.models' not found" in report
    # The constructor raises: Ray reports the deployment, whose name is the node id.
    assert 'application "crashing": DEPLOY_FAILED' in report
    assert 'node "embedder": DEPLOY_FAILED (REPLICA_STARTUP_FAILED)' in report
    assert "dimensions must be a positive integer, got 0" in report
    assert "Traceback" not in report and '  File "' not in report


async def test_mini_sample_serves_at_the_printed_url(
    ray_head: RayHead, serve_port: int, http: aiohttp.ClientSession
) -> None:
    out, err = io.StringIO(), io.StringIO()
    code = await up.up(
        SAMPLES / "mini.txtpb", address=ray_head.address, token=ray_head.token, timeout_s=240, out=out, err=err
    )
    assert code == 0, err.getvalue()
    assert "sentiment: RUNNING" in err.getvalue()  # progress went to stderr
    url = f"http://127.0.0.1:{serve_port}/sentiment"
    assert out.getvalue() == f"sentiment: {url}\n"
    assert await request(http, url, {"text": "I love this great movie"}) == (200, {"label": "positive", "score": 1.0})
    # Polarity 1/3 is "positive" at the default threshold 0; the sample's user_config sets 0.5.
    assert await request(http, url, {"text": "good and great, but boring"}) == (
        200,
        {"label": "neutral", "score": 0.3333},
    )


async def test_down_removes_every_application(ray_head: RayHead, serve_port: int, dash: RayDashboard) -> None:
    code = await up.up(
        SAMPLES / "mini.txtpb", address=ray_head.address, token=ray_head.token, out=io.StringIO(), err=io.StringIO()
    )
    assert code == 0
    err = io.StringIO()
    try:
        assert await up.down(address=ray_head.address, token=ray_head.token, err=err) == 0
        assert "removed sentiment" in err.getvalue()
        assert (await dash.get_applications()).applications == {}
    finally:
        await start_serve(ray_head, serve_port)  # DELETE shut Serve down; later tests need its port


async def test_dashboard_errors_never_contain_the_token(ray_head: RayHead, serve_port: int) -> None:
    async with RayDashboard(ray_head.address, None) as anonymous:
        with pytest.raises(DashboardError, match="401, the dashboard requires a token"):
            await anonymous.get_applications()
    wrong = "not-the-token-" + ray_head.token[:8]
    async with RayDashboard(ray_head.address, wrong) as dash:
        with pytest.raises(DashboardError, match="403") as raised:
            await dash.put_applications({"applications": []})
    assert wrong not in str(raised.value) and wrong not in repr(dash)
    err = io.StringIO()
    code = await up.up(SAMPLES / "mini.txtpb", address=ray_head.address, token=wrong, out=io.StringIO(), err=err)
    assert code == 2
    assert "403" in err.getvalue() and wrong not in err.getvalue()


async def test_up_onto_a_cluster_too_small_says_so_at_once(
    ray_head: RayHead, serve_port: int, dash: RayDashboard, tmp_path: Path
) -> None:
    """Issue 47: 25 nodes at 0.1 CPU on the session's 2-CPU head waited 300 s, then listed every
    replica as unschedulable. Now the graph's needs are compared with what the real dashboard says
    the cluster has, before anything is deployed."""
    nodes = capacity.alive_resources(await dash.nodes())
    assert [n["CPU"] for n in nodes] == [2.0] and nodes[0]["memory"] > 0  # Ray 2.60's state API, read as up reads it
    g = graph_pb2.Graph(name="wide", version="1", schema_version=1)
    app = g.applications.add(name="wide", route_prefix="/wide", ingress="n0")
    for i in range(25):
        node = app.nodes[f"n{i}"]
        node.deployment.import_path = "e2e_apps:Echo"
        node.resources.num_cpus = 0.1
        if i:
            app.nodes["n0"].deployment.kwargs[f"k{i}"].node.id = f"n{i}"
    path = tmp_path / "wide.pb"
    path.write_bytes(g.SerializeToString())
    running = sorted((await dash.get_applications()).applications)
    err = io.StringIO()
    start = time.monotonic()
    code = await up.up(path, address=ray_head.address, token=ray_head.token, timeout_s=300, err=err)
    assert code == 2 and time.monotonic() - start < 30, err.getvalue()
    assert err.getvalue().startswith(
        "servegraph up: the graph needs 2.5 CPU for its 25 replicas at their start, the cluster has 2; nothing deployed\n"
    )
    assert sorted((await dash.get_applications()).applications) == running


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


@pytest.fixture
def own_session() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes started here lead their own session; teardown ends each whole session by pid."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        assert end_session(proc) == [], "processes of the --start-local head survived"


def test_cli_up_start_local_serves_the_mini_sample(own_session: list[subprocess.Popen[bytes]]) -> None:
    """The README's first command on a machine with no Ray running: a fresh HOME, no token anywhere."""
    if not all(_port_free(p) for p in (8000, 6379, 10001)):
        pytest.skip("Ray's default ports (6379, 10001) or Serve's 8000 are taken on this machine")
    home = Path(tempfile.mkdtemp(prefix="sgh", dir="/tmp"))  # short: Ray's unix sockets live under it
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), RAY_TMPDIR=str(home), RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.Popen(
        [str(SERVEGRAPH), "up", str(SAMPLES / "mini.txtpb"), "--start-local", f"--address=http://127.0.0.1:{port}"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    own_session.append(proc)
    stdout, stderr = proc.communicate(timeout=400)
    assert proc.returncode == 0, stderr.decode()
    assert re.fullmatch(rb"sentiment: http://127\.0\.0\.1:8000/sentiment\n", stdout), stdout
    token = (home / ".ray" / "auth_token").read_text().strip()
    assert token and token.encode() not in stdout + stderr
    assert session_pids(proc.pid), "the Ray head should outlive `servegraph up`"

    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/api/serve/applications/", timeout=30)
    assert denied.value.code == 401  # token auth is on
    answer = urllib.request.urlopen(
        urllib.request.Request(
            "http://127.0.0.1:8000/sentiment", data=b'{"text": "what a wonderful day"}', method="POST"
        ),
        timeout=30,
    ).read()
    assert answer == b'{"label":"positive","score":1.0}'
    assert end_session(proc) == []
    shutil.rmtree(home, ignore_errors=True)
