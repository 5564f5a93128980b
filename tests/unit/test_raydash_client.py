"""The dashboard client: token lookup, the real Ray 2.60 response shape, and errors that keep the token secret."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from servegraph.raydash.dashboard import (
    DashboardError,
    DashboardUnreachable,
    RayDashboard,
    parse_serve_details,
    resolve_token,
    summarize_message,
)

# Captured from `GET /api/serve/applications/?api_type=declarative` on Ray 2.60.0 with the
# mini sample running and tests/e2e/graphs/broken.txtpb failed.
RECORDED = Path(__file__).parent / "data" / "ray-2.60-serve-applications.json"
TOKEN = "s3cr3t-token-value"


def test_token_order_matches_rays_loader(tmp_path: Path) -> None:
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("from-home\n")
    (tmp_path / "elsewhere").write_text("  from-path  ")
    env = {"RAY_AUTH_TOKEN": "from-env", "RAY_AUTH_TOKEN_PATH": str(tmp_path / "elsewhere")}
    assert resolve_token("explicit", env, tmp_path) == "explicit"
    assert resolve_token(None, env, tmp_path) == "from-env"
    assert resolve_token(None, {**env, "RAY_AUTH_TOKEN": " "}, tmp_path) == "from-path"
    assert resolve_token(None, {"RAY_AUTH_TOKEN_PATH": str(tmp_path / "gone")}, tmp_path) == "from-home"
    assert resolve_token(None, {}, tmp_path / "nohome") is None


def test_parses_the_recorded_ray_2_60_response() -> None:
    state = parse_serve_details(json.loads(RECORDED.read_text()))
    assert sorted(state.applications) == ["crashing", "scoring", "sentiment"]
    assert (state.http_host, state.http_port) == ("127.0.0.1", 35855)

    sentiment = state.applications["sentiment"]
    assert (sentiment.status, sentiment.route_prefix, sentiment.message) == ("RUNNING", "/sentiment", "")
    assert sorted((d.name, d.status, d.replicas) for d in sentiment.deployments) == [
        ("sentiment", "HEALTHY", 1),
        ("tokenizer", "HEALTHY", 1),
    ]
    assert sentiment.deployed_app_config is not None
    assert sentiment.deployed_app_config["import_path"] == "servegraph.runtime:build"

    scoring = state.applications["scoring"]
    assert scoring.status == "DEPLOY_FAILED" and scoring.deployments == ()
    assert summarize_message(scoring.message) == (
        "Deploying app 'scoring' failed with exception:\n"
        'servegraph.runtime.spec.BuildError: node "scorer", field deployment.import_path: '
        "'e2e_apps_missing.models:Scorer': module 'e2e_apps_missing.models' not found "
        "(is it installed in the Ray image or listed in runtime_env?)"
    )

    (embedder,) = state.applications["crashing"].deployments
    assert (embedder.name, embedder.status, embedder.status_trigger) == (
        "embedder",
        "DEPLOY_FAILED",
        "REPLICA_STARTUP_FAILED",
    )
    summary = summarize_message(embedder.message)
    assert summary.startswith("The deployment failed to start 3 times in a row.")
    assert summary.endswith("\nValueError: dimensions must be a positive integer, got 0")
    assert "\x1b[" not in summary and "File " not in summary


def test_parses_the_empty_answer_of_a_cluster_without_serve() -> None:
    state = parse_serve_details({"controller_info": {}, "proxies": {}, "applications": {}, "target_capacity": None})
    assert (state.applications, state.http_host, state.http_port) == ({}, None, None)


def test_summary_keeps_messages_without_tracebacks() -> None:
    assert summarize_message("Failed to update the deployments ['a'].\n") == "Failed to update the deployments ['a']."


class Dashboard:
    """A stand-in dashboard speaking Ray's REST shapes, recording what it was sent."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.status = 200
        self.redirect_to: str | None = None

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append(
            {
                "method": request.method,
                "path": request.path,
                "query": dict(request.query),
                "auth": request.headers.get("x-ray-authorization"),
                "content_type": request.content_type,
                "body": await request.text(),
            }
        )
        if self.redirect_to is not None:  # a proxy in front, sending everyone to its login page
            raise web.HTTPFound(self.redirect_to)
        if request.headers.get("x-ray-authorization") is None:
            return web.Response(status=401, text="Unauthorized: Missing authentication token")
        if request.headers["x-ray-authorization"] != f"Bearer {TOKEN}":
            return web.Response(status=403, text="Forbidden: Invalid authentication token")
        if self.status != 200:
            return web.Response(
                status=self.status, text=f"bad config, echoing {request.headers['x-ray-authorization']}"
            )
        if request.method == "GET" and request.path == "/api/serve/applications/":
            return web.json_response(json.loads(RECORDED.read_text()))
        return web.Response()


@contextlib.asynccontextmanager
async def serving(fake: Dashboard) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@pytest.fixture
async def dashboard() -> AsyncIterator[tuple[Dashboard, str]]:
    fake = Dashboard()
    async with serving(fake) as address:
        yield fake, address


async def test_speaks_the_serve_rest_api_with_the_token_header(dashboard: tuple[Dashboard, str]) -> None:
    fake, address = dashboard
    async with RayDashboard(address + "/", TOKEN) as dash:
        await dash.put_applications({"applications": [{"name": "a", "import_path": "m:b"}]})
        state = await dash.get_applications()
        await dash.delete_applications()
    assert "sentiment" in state.applications
    put, get, delete = fake.seen
    assert put == {
        "method": "PUT",
        "path": "/api/serve/applications/",
        "query": {},
        "auth": f"Bearer {TOKEN}",
        "content_type": "application/json",
        "body": '{"applications": [{"name": "a", "import_path": "m:b"}]}',
    }
    assert (get["method"], get["query"], get["auth"]) == ("GET", {"api_type": "declarative"}, f"Bearer {TOKEN}")
    assert (delete["method"], delete["path"]) == ("DELETE", "/api/serve/applications/")


async def test_auth_failures_explain_without_the_token(dashboard: tuple[Dashboard, str]) -> None:
    _, address = dashboard
    async with RayDashboard(address, None) as anonymous:
        with pytest.raises(DashboardError, match=r"401, the dashboard requires a token: pass --token, set RAY_AUTH"):
            await anonymous.get_applications()
    async with RayDashboard(address, "wrong-token") as wrong:
        with pytest.raises(DashboardError) as raised:
            await wrong.get_applications()
    assert "403, the dashboard rejected the token" in str(raised.value)
    assert "wrong-token" not in str(raised.value) and "wrong-token" not in repr(wrong)


async def test_error_bodies_are_shown_with_the_token_scrubbed(dashboard: tuple[Dashboard, str]) -> None:
    fake, address = dashboard
    fake.status = 400
    async with RayDashboard(address, TOKEN) as dash:
        with pytest.raises(DashboardError) as raised:
            await dash.put_applications({"applications": []})
    message = str(raised.value)
    assert message.startswith(f"PUT {address}/api/serve/applications/: 400: bad config, echoing Bearer <token>")
    assert TOKEN not in message


async def test_nothing_listening_is_unreachable_not_a_crash() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: connections are refused
        async with RayDashboard(f"http://127.0.0.1:{port}", TOKEN) as dash:
            with pytest.raises(DashboardUnreachable, match=f"no Ray dashboard answers at http://127.0.0.1:{port}"):
                await dash.version()


async def test_a_redirect_is_not_followed_and_the_token_stays(dashboard: tuple[Dashboard, str]) -> None:
    """A proxy's login page on another origin must not be sent the token: aiohttp drops only
    `Authorization` on such a redirect, and the dashboard's header is `x-ray-authorization`."""
    proxy, address = dashboard
    elsewhere = Dashboard()
    async with serving(elsewhere) as login:
        proxy.redirect_to = f"{login}/sso/login?state=abc"
        async with RayDashboard(address, TOKEN) as dash:
            with pytest.raises(DashboardError) as raised:
                await dash.get_applications()
    assert elsewhere.seen == [], "the redirect was followed"
    message = str(raised.value)
    assert message.startswith(
        f"GET {address}/api/serve/applications/: 302, a redirect to {login}/sso/login, not followed"
    )
    assert "state=abc" not in message and TOKEN not in message
