"""One operator downloads for every tenant: no download may carry state from another.

Real HTTPS registries on loopback under names of one parent domain (a.example.test,
b.example.test), each with its own certificate from the test CA. The names resolve to
loopback through the connector's resolver: everything else (TLS, the guard's socket
factory, the cookie handling under test) is what the operator runs.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
import trustme
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from support import REGISTRY_TOKEN as TOKEN

from servegraph.source import FetchError, FetchRequest, RegistryClient, SourcePolicy

BODY = b"\x0a\x04mini graph bytes"


class Loopback(AbstractResolver):
    """Every name is 127.0.0.1: several "hosts" of one parent domain on one machine."""

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [
            {
                "hostname": host,
                "host": "127.0.0.1",
                "port": port,
                "family": socket.AF_INET,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
        ]

    async def close(self) -> None:
        return None


@dataclass(frozen=True)
class NamedLoopback(SourcePolicy):
    """The policy tests use for loopback registries, with names resolved as above."""

    def connector(self, **kwargs: Any) -> aiohttp.TCPConnector:
        return super().connector(resolver=Loopback(), **kwargs)


POLICY = NamedLoopback(allowed_networks=SourcePolicy.build(allowed_networks=["127.0.0.0/8"]).allowed_networks)
POLICY_HTTP = NamedLoopback(allowed_networks=POLICY.allowed_networks, allow_insecure_http=True)


class Server:
    """A registry that sets a cookie on every answer and records the Cookie header it receives.

    `/g` answers the graph (with a bearer check); `/r` answers 307 to `redirect_to`.
    """

    def __init__(self, host: str, cookie: str, tls: ssl.SSLContext | None) -> None:
        self.host, self.cookie, self.tls = host, cookie, tls
        self.cookies: list[str | None] = []
        self.redirect_to = ""
        self.port = 0
        self._runner: web.AppRunner | None = None

    def url(self, path: str) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}{path}"

    async def __aenter__(self) -> Server:
        async def graph(request: web.Request) -> web.Response:
            self.cookies.append(request.headers.get("Cookie"))
            if request.headers.get("Authorization") != f"Bearer {TOKEN}":
                return web.Response(status=401, headers={"Set-Cookie": self.cookie})
            return web.Response(body=BODY, headers={"Set-Cookie": self.cookie})

        async def redirect(request: web.Request) -> web.Response:
            self.cookies.append(request.headers.get("Cookie"))
            return web.Response(status=307, headers={"Location": self.redirect_to, "Set-Cookie": self.cookie})

        app = web.Application()
        app.router.add_get("/g", graph)
        app.router.add_get("/r", redirect)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self.tls).start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


@pytest.fixture(scope="module")
def named_tls(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("a.example.test", "b.example.test").configure_cert(ctx)
    return ctx


@pytest.fixture
async def client() -> AsyncIterator[RegistryClient]:
    async with RegistryClient(POLICY_HTTP) as c:
        yield c


async def test_a_cookie_for_the_parent_domain_never_reaches_another_tenants_registry(
    client: RegistryClient, named_tls: ssl.SSLContext, ca_pem: str
) -> None:
    """Tenant A's registry sets a cookie for example.test; tenant B's registry, b.example.test,
    must not receive it with B's token, nor A's registry B's session cookie."""
    parent = "tenant=a; Domain=example.test; Path=/; Secure"
    async with (
        Server("a.example.test", parent, named_tls) as a,
        Server("b.example.test", "session=b-secret; Path=/; Secure; HttpOnly", named_tls) as b,
    ):
        for server in (a, b, a, b):
            got = await client.fetch(FetchRequest(url=server.url("/g"), token=TOKEN, ca_pem=ca_pem, attempts=1))
            assert got.body == BODY
        assert b.cookies == [None, None], "tenant A's cookie went to tenant B's registry"
        assert a.cookies == [None, None], "tenant B's session cookie went to tenant A's registry"


@pytest.mark.parametrize("scheme", ["https", "http"])
async def test_a_redirect_to_another_port_of_the_host_carries_no_cookie(
    client: RegistryClient, named_tls: ssl.SSLContext, ca_pem: str, scheme: str
) -> None:
    """A cookie is not bound to a port: the default jar sent it to whatever else listens on
    that host, and over plain http too where http is allowed."""
    async with (
        Server("a.example.test", "sid=a-secret; Path=/", named_tls) as first,
        Server("a.example.test", "other=1; Path=/", named_tls if scheme == "https" else None) as other,
    ):
        first.redirect_to = other.url("/g")
        request = FetchRequest(
            url=first.url("/r"), token=TOKEN, ca_pem=ca_pem, attempts=1, allow_insecure_http=scheme == "http"
        )
        for _ in range(2):
            with pytest.raises(FetchError) as err:
                await client.fetch(request)
            assert err.value.reason == "Unauthorized"  # another port, another origin: the token stays behind
        assert first.cookies == [None, None] and other.cookies == [None, None]
