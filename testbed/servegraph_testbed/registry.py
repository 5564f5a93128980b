"""A minimal graph registry: graphs over HTTP(S) with a bearer check and ETags.

Real enough to test the operator's client against (tests and `make demo` run
it on loopback or on the node tier's host address), small enough to read in one
sitting. Graphs are read with the read token and published (`PUT`) with a
separate publish token, as a registry would separate readers from publishers. Faults can be injected
per path so the tests can prove how the operator behaves when a registry
misbehaves.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ssl
from dataclasses import dataclass, field

from aiohttp import web

GRAPH_PATH = "/v1/graphs/{name}"


@dataclass
class Fault:
    """Misbehaviour for the next requests of one graph.

    status: answer this HTTP status `times` times (e.g. 503, then recover).
    hang_s: wait this long before answering. truncate: send half the body and
    close. redirect_to: answer 307 to this URL. retry_after: Retry-After value.
    chunked: stream the body without a Content-Length. stall_body_s: send the headers
    and half the body, then wait this long before the rest (a registry that answered
    but is slow to finish). trickle_bytes_per_s: send the body at this pace, a few bytes
    at a time (a registry that holds a download to its deadline).
    """

    status: int | None = None
    times: int = 1
    hang_s: float = 0.0
    truncate: bool = False
    redirect_to: str | None = None
    retry_after: str | None = None
    chunked: bool = False
    stall_body_s: float = 0.0
    trickle_bytes_per_s: float = 0.0


@dataclass
class Registry:
    """In-memory graphs by name, and what the server has seen."""

    token: str
    publish_token: str | None = None  # None: the PUT publish call is refused
    graphs: dict[str, bytes] = field(default_factory=dict)
    faults: dict[str, Fault] = field(default_factory=dict)
    requests: list[dict[str, str | None]] = field(default_factory=list)

    def publish(self, name: str, data: bytes) -> str:
        """Store a graph; returns its ETag (the content digest)."""
        self.graphs[name] = data
        return etag_of(data)


def etag_of(data: bytes) -> str:
    return f'"{hashlib.sha256(data).hexdigest()[:32]}"'


def make_app(registry: Registry) -> web.Application:
    app = web.Application()

    async def get_graph(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        auth = request.headers.get("Authorization")
        registry.requests.append(
            {"name": name, "authorization": auth, "if_none_match": request.headers.get("If-None-Match")}
        )
        fault = registry.faults.get(name)
        if fault is not None:
            if fault.hang_s:
                await asyncio.sleep(fault.hang_s)
            if fault.redirect_to:
                raise web.HTTPTemporaryRedirect(fault.redirect_to)
            if fault.status is not None and fault.times > 0:
                fault.times -= 1
                headers = {"Retry-After": fault.retry_after} if fault.retry_after else None
                return web.Response(status=fault.status, text="injected fault\n", headers=headers)
        expected = f"Bearer {registry.token}"
        if auth is None:
            return web.Response(status=401, text="missing bearer token\n", headers={"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(auth.encode(), expected.encode()):
            return web.Response(status=403, text="wrong bearer token\n")
        data = registry.graphs.get(name)
        if data is None:
            return web.Response(status=404, text=f"no graph {name!r}\n")
        tag = etag_of(data)
        if request.headers.get("If-None-Match") == tag:
            return web.Response(status=304, headers={"ETag": tag})
        if fault is not None and fault.truncate:
            resp = web.StreamResponse(headers={"ETag": tag, "Content-Length": str(len(data))})
            await resp.prepare(request)
            await resp.write(data[: len(data) // 2])
            assert request.transport is not None
            request.transport.close()
            return resp
        if fault is not None and fault.stall_body_s:
            resp = web.StreamResponse(headers={"ETag": tag, "Content-Length": str(len(data))})
            await resp.prepare(request)
            await resp.write(data[: len(data) // 2])
            await asyncio.sleep(fault.stall_body_s)
            await resp.write(data[len(data) // 2 :])
            return resp
        if fault is not None and fault.trickle_bytes_per_s:
            resp = web.StreamResponse(headers={"ETag": tag, "Content-Length": str(len(data))})
            await resp.prepare(request)
            step = max(1, int(fault.trickle_bytes_per_s / 10))  # ten writes a second
            for i in range(0, len(data), step):
                await resp.write(data[i : i + step])
                await asyncio.sleep(step / fault.trickle_bytes_per_s)
            return resp
        if fault is not None and fault.chunked:
            resp = web.StreamResponse(headers={"ETag": tag})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            for i in range(0, len(data), 1024):
                await resp.write(data[i : i + 1024])
            await resp.write_eof()
            return resp
        return web.Response(body=data, content_type="application/x-protobuf", headers={"ETag": tag})

    async def put_graph(request: web.Request) -> web.StreamResponse:
        """Publish: the body is the graph's bytes; answers its ETag (the content digest)."""
        name = request.match_info["name"]
        auth = request.headers.get("Authorization", "")
        if registry.publish_token is None:
            return web.Response(status=405, text="publishing is off\n")
        if not hmac.compare_digest(auth.encode(), f"Bearer {registry.publish_token}".encode()):
            return web.Response(status=401, text="publish token required\n", headers={"WWW-Authenticate": "Bearer"})
        data = await request.read()
        if not data:
            return web.Response(status=400, text="empty graph\n")
        tag = registry.publish(name, data)
        return web.Response(status=201, text=tag + "\n", headers={"ETag": tag})

    app.router.add_get(GRAPH_PATH, get_graph)
    app.router.add_put(GRAPH_PATH, put_graph)
    return app


class RegistryServer:
    """Runs a Registry on a free port of `host`, HTTPS when given a server SSL context."""

    def __init__(self, registry: Registry, ssl_context: ssl.SSLContext | None = None, host: str = "127.0.0.1") -> None:
        self.registry = registry
        self._ssl = ssl_context
        self._host = host
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        scheme = "https" if self._ssl else "http"
        return f"{scheme}://{self._host}:{self.port}"

    def url(self, name: str) -> str:
        return self.base_url + GRAPH_PATH.format(name=name)

    async def start(self) -> RegistryServer:
        # A fault may hang a handler on purpose (hang_s): teardown waits 2 s for it, not aiohttp's 60.
        self._runner = web.AppRunner(make_app(self.registry), access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, 0, ssl_context=self._ssl)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> RegistryServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
