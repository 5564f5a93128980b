"""A client for the Ray dashboard's Serve REST API, the way KubeRay talks to a cluster.

`PUT /api/serve/applications/` replaces the declarative applications with a
Serve config; `GET ...?api_type=declarative` reads their status back;
`DELETE` shuts Serve down. Ray 2.60 dashboards with token auth want
`x-ray-authorization: Bearer <token>`; the token never appears in logs or
exception messages.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urljoin

import aiohttp

from servegraph.source import safe_url

APPS_PATH = "/api/serve/applications/"
TOKEN_ENV = "RAY_AUTH_TOKEN"  # noqa: S105 - a variable name, not a secret
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"  # noqa: S105
AUTH_HEADER = "x-ray-authorization"
_MAX_BODY_IN_ERROR = 2000


class DashboardError(Exception):
    """The dashboard refused or failed a request; the message is safe to print."""


class DashboardUnreachable(DashboardError):
    """Nothing answers at the dashboard address."""


def default_token_path(home: Path | None = None) -> Path:
    """Where `ray get-auth-token --generate` and a local `ray.init()` keep the token."""
    return (home or Path.home()) / ".ray" / "auth_token"


def resolve_token(
    explicit: str | None = None,
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
) -> str | None:
    """The token to send, in Ray's own order after an explicit one.

    Ray's loader reads `RAY_AUTH_TOKEN`, then the file named by
    `RAY_AUTH_TOKEN_PATH`, then `~/.ray/auth_token`. None means send no header
    (a dashboard without token auth accepts that).
    """
    env = os.environ if env is None else env
    if explicit:
        return explicit.strip()
    if env.get(TOKEN_ENV, "").strip():
        return env[TOKEN_ENV].strip()
    candidates = [Path(env[TOKEN_PATH_ENV])] if env.get(TOKEN_PATH_ENV) else []
    candidates.append(default_token_path(home))
    for path in candidates:
        try:
            token = path.read_text().strip()
        except OSError:
            continue
        if token:
            return token
    return None


@dataclass(frozen=True)
class DeploymentState:
    name: str
    status: str
    message: str
    status_trigger: str = ""
    replicas: int = 0
    replica_ids: tuple[str, ...] = ()
    """Ray Serve's id of each running replica: a restart gives a replica a new one."""


@dataclass(frozen=True)
class AppState:
    name: str
    status: str
    message: str
    route_prefix: str | None
    deployments: tuple[DeploymentState, ...]
    deployed_app_config: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ServeState:
    applications: Mapping[str, AppState]
    http_host: str | None
    http_port: int | None
    grpc_port: int | None = None
    grpc_servicer_functions: tuple[str, ...] = ()
    """What Serve's gRPC proxy serves: fixed when Serve started, whatever was deployed since."""


def parse_serve_details(doc: Mapping[str, Any]) -> ServeState:
    """Read the parts of Ray's `ServeInstanceDetails` JSON that status reporting needs.

    Shape on Ray 2.60: `{"applications": {name: {"status", "message",
    "route_prefix", "deployed_app_config", "deployments": {name: {"status",
    "status_trigger", "message", "replicas": [...]}}}}, "http_options": {"host",
    "port"}, ...}`; with Serve not started it is just `{"controller_info": {},
    "proxies": {}, "applications": {}, "target_capacity": null}`.
    """
    apps: dict[str, AppState] = {}
    for name, app in (doc.get("applications") or {}).items():
        deployments = tuple(
            DeploymentState(
                name=dep_name,
                status=str(dep.get("status", "")),
                message=str(dep.get("message") or ""),
                status_trigger=str(dep.get("status_trigger") or ""),
                replicas=len(dep.get("replicas") or []),
                replica_ids=tuple(sorted(str(r.get("replica_id", "")) for r in dep.get("replicas") or ())),
            )
            for dep_name, dep in (app.get("deployments") or {}).items()
        )
        apps[name] = AppState(
            name=name,
            status=str(app.get("status", "")),
            message=str(app.get("message") or ""),
            route_prefix=app.get("route_prefix"),
            deployments=deployments,
            deployed_app_config=app.get("deployed_app_config"),
        )
    http = doc.get("http_options") or {}
    port = http.get("port")
    grpc = doc.get("grpc_options") or {}
    grpc_port = grpc.get("port")
    return ServeState(
        applications=apps,
        http_host=http.get("host"),
        http_port=port if isinstance(port, int) else None,
        grpc_port=grpc_port if isinstance(grpc_port, int) else None,
        grpc_servicer_functions=tuple(str(f) for f in grpc.get("grpc_servicer_functions") or ()),
    )


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def summarize_message(message: str) -> str:
    """Ray's status message without the traceback frames: the headline and the exception.

    Ray puts whole tracebacks into status messages; the first line says what
    failed and the lines after the last frame say why (e.g. servegraph's
    BuildError naming the node).
    """
    lines = [line.rstrip() for line in _ANSI.sub("", message).strip().splitlines()]
    frames = [i for i, line in enumerate(lines) if line.startswith(" ")]
    if not frames or not any("Traceback" in line or "File " in line for line in lines):
        return "\n".join(lines)
    tail = [line for line in lines[frames[-1] + 1 :] if line]
    head = lines[0] if not lines[0].startswith(("Traceback", " ")) else ""
    return "\n".join(line for line in [head, *tail] if line)


def _target(url: str, location: str) -> str:
    """A redirect's target as a log may show a URL (`safe_url`: a login page's query may carry state)."""
    if not location:
        return "nowhere (no Location)"
    try:
        return safe_url(urljoin(url, location))
    except ValueError:  # urljoin's own parse, e.g. an unclosed IPv6 literal
        return "an invalid URL"


class RayDashboard:
    """Async client of one dashboard; use as `async with RayDashboard(address) as dash:`."""

    def __init__(self, address: str, token: str | None = None, *, request_timeout_s: float = 30.0) -> None:
        self.address = address.rstrip("/")
        self._token = token
        self._timeout = aiohttp.ClientTimeout(total=request_timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:  # never show the token
        return f"RayDashboard({self.address!r}, token={'set' if self._token else 'none'})"

    async def __aenter__(self) -> RayDashboard:
        headers = {AUTH_HEADER: f"Bearer {self._token}"} if self._token else {}
        self._session = aiohttp.ClientSession(headers=headers, timeout=self._timeout)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def version(self) -> dict[str, Any]:
        """`GET /api/ray/version`: cheap liveness check that also needs no Serve."""
        result = await self._request("GET", "/api/ray/version")
        return result if isinstance(result, dict) else {}

    async def put_applications(self, config: Mapping[str, Any]) -> None:
        """Replace the cluster's declarative Serve applications with `config`."""
        await self._request("PUT", APPS_PATH, body=json.dumps(config).encode())

    async def get_applications(self) -> ServeState:
        doc = await self._request("GET", APPS_PATH, params={"api_type": "declarative"})
        return parse_serve_details(doc if isinstance(doc, Mapping) else {})

    async def nodes(self) -> list[dict[str, Any]]:
        """`GET /api/v0/nodes` (Ray's state API): every node, with `state` and `resources_total`."""
        doc = await self._request("GET", "/api/v0/nodes", params={"limit": "10000"})
        # {"result": true, "msg": "", "data": {"result": {"total": N, "result": [node, ...], ...}}}
        found: Any = doc
        for key in ("data", "result", "result"):
            found = found.get(key) if isinstance(found, Mapping) else None
        return [n for n in found if isinstance(n, dict)] if isinstance(found, list) else []

    async def delete_applications(self) -> None:
        """Delete every Serve application (Ray shuts Serve down on this cluster)."""
        await self._request("DELETE", APPS_PATH)

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Any:
        if self._session is None:
            raise RuntimeError("use RayDashboard as an async context manager")
        url = self.address + path
        headers = {"content-type": "application/json"} if body is not None else {}
        try:
            # No redirects: the token is a session header, and aiohttp drops only `Authorization`
            # when a redirect leaves the origin; a proxy's login page elsewhere would be sent it.
            async with self._session.request(
                method, url, data=body, params=params, headers=headers, allow_redirects=False
            ) as resp:
                text = await resp.text()
                status = resp.status
                location = resp.headers.get("Location", "")
        except TimeoutError:  # before ClientConnectionError: ServerTimeoutError is both
            raise DashboardError(f"{method} {url}: no answer within {self._timeout.total:g}s") from None
        except aiohttp.ClientConnectionError as e:
            raise DashboardUnreachable(f"no Ray dashboard answers at {self.address}: {self._scrub(str(e))}") from None
        if 300 <= status < 400:
            raise DashboardError(
                f"{method} {url}: {status}, a redirect to {_target(url, location)}, not followed: the token goes only "
                "to --address, so give it the dashboard's own URL (no proxy login in front of it)"
            )
        if status == 401:
            raise DashboardError(
                f"{method} {url}: 401, the dashboard requires a token: pass --token, "
                f"set {TOKEN_ENV} or {TOKEN_PATH_ENV}, or put it in {default_token_path()}"
            )
        if status == 403:
            raise DashboardError(f"{method} {url}: 403, the dashboard rejected the token")
        if status >= 400:
            raise DashboardError(f"{method} {url}: {status}: {self._scrub(text)[:_MAX_BODY_IN_ERROR]}")
        if not text:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return text

    def _scrub(self, text: str) -> str:
        return text.replace(self._token, "<token>") if self._token else text
