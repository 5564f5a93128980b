"""Where a hostile tenant points a ServeGraph (issue 14, items 1, 2, 3 and 5), against
`servegraph run` as a real process on the real API server, and `servegraph fetch`, which
must refuse the same sources with the same message.

No URL here sends a packet off loopback: everything not on loopback is refused before
any connection is made (that is what is tested).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from security_support import MAX_FETCH_SECONDS, MAX_GRAPH_BYTES, Secured, fetch_cli, secured_kit, start_secured
from sg_support import Kit
from support import REGISTRY_TOKEN

from servegraph_testbed import ControlPlane
from servegraph_testbed.registry import Fault, RegistryServer

UNIFORM = "the connection failed, timed out or was not trusted (TLS)"


@pytest.fixture(scope="module")
def secured(control_plane: ControlPlane) -> Iterator[Secured]:
    yield from start_secured(control_plane, "servegraph-operator-sources")


@pytest.fixture
async def kit(
    secured: Secured, admin_api: Any, namespace: str, registry: RegistryServer, ca_pem: str
) -> AsyncIterator[Kit]:
    async with secured_kit(admin_api, namespace, registry, ca_pem) as k:
        yield k


def _fullwidth(text: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) for c in text)  # digits and "." to their fullwidth forms


def _refused_urls(cp: ControlPlane) -> dict[str, str]:
    return {
        "fullwidth-metadata": f"https://{_fullwidth('169.254.169.254')}/latest/meta-data",
        "hex-metadata": "https://0xA9FEA9FE/latest/meta-data",
        "mapped-metadata": "https://[::ffff:169.254.169.254]/latest/meta-data",
        "nat64-metadata": "https://[64:ff9b::a9fe:a9fe]/latest/meta-data",
        "alibaba-metadata": "https://100.100.100.200/latest/meta-data",
        "api-server": f"https://127.0.0.1:{cp.apiserver_port}/api/v1/secrets",
        "service-range": "https://10.0.0.1/api/v1/secrets",
    }


@pytest.mark.parametrize(
    "case",
    [
        "fullwidth-metadata",
        "hex-metadata",
        "mapped-metadata",
        "nat64-metadata",
        "alibaba-metadata",
        "api-server",
        "service-range",
    ],
)
async def test_refused_sources_and_the_cli_says_the_same(
    kit: Kit, control_plane: ControlPlane, tmp_path: Path, case: str
) -> None:
    url = _refused_urls(control_plane)[case]
    await kit.servegraph("refused", "x", url=url)
    cond = await kit.wait_condition("refused", "Fetched", "False", "SourceRefused")
    assert "punycode" in cond["message"] or "graphs may not be downloaded from" in cond["message"]
    assert "169.254.169.254" not in cond["message"] or "169.254.169.254" in url
    assert await kit.get_rs("refused") is None
    admin = str(control_plane.kubeconfig("admin"))
    cli = await asyncio.to_thread(fetch_cli, tmp_path, url, "--allow-network", "127.0.0.0/8", "--kubeconfig", admin)
    assert cli.returncode == 3, cli.stderr
    assert cli.stderr.splitlines()[0] == f"error: SourceRefused: {cond['message']}"


async def test_a_failed_address_tells_the_tenant_nothing_about_its_ports(kit: Kit) -> None:
    """A closed port and a port that answers but is not HTTPS read the same to the tenant."""

    async def banner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(banner, "127.0.0.1", 0)
    open_port = server.sockets[0].getsockname()[1]
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    closed_port = probe.getsockname()[1]
    probe.close()
    try:
        messages = {}
        for name, port in (("open", open_port), ("closed", closed_port)):
            await kit.servegraph(name, "x", url=f"https://127.0.0.1:{port}/v1/graphs/x")
            cond = await kit.wait_condition(name, "Fetched", "False", "Unreachable")
            messages[name] = cond["message"].replace(str(port), "PORT")
    finally:
        server.close()
    assert messages["open"] == messages["closed"] == f"no answer from https://127.0.0.1:PORT/v1/graphs/x: {UNIFORM}"


async def test_one_deadline_caps_a_download_of_many_slow_hops(kit: Kit) -> None:
    """The ServeGraph asks for 10 minutes; five redirects that each answer in 0.9 s, then 503s:
    the administrator's 3 s cover them all, and the first failure is reported at once."""
    graph = f"{kit.namespace}-hops"
    for i in range(5):
        kit.registry.registry.faults[f"{graph}{i}"] = Fault(hang_s=0.9, redirect_to=kit.registry.url(f"{graph}{i + 1}"))
    kit.registry.registry.faults[f"{graph}5"] = Fault(hang_s=0.9, status=503, times=1000)
    started = time.monotonic()
    await kit.servegraph("slow", f"{graph}0", timeout="10m")
    cond = await kit.wait_condition("slow", "Fetched", "False", within=30)
    elapsed = time.monotonic() - started
    assert cond["reason"] in {"Unreachable", "HTTP503"}
    # One download took at most the deadline; with a timeout per hop and per attempt it took over 20 s.
    assert elapsed < MAX_FETCH_SECONDS + 10, f"first failure reported {elapsed:.1f} s after creation"


async def test_the_administrator_caps_what_a_servegraph_may_download(kit: Kit) -> None:
    kit.registry.registry.publish(f"{kit.namespace}-big", b"\x00" * (MAX_GRAPH_BYTES + 1))
    await kit.servegraph("big", f"{kit.namespace}-big", maxBytes=268435456)
    cond = await kit.wait_condition("big", "Fetched", "False", "TooLarge")
    assert f"over the limit of {MAX_GRAPH_BYTES}" in cond["message"]


async def test_a_broken_ca_bundle_is_a_condition_and_is_retried(kit: Kit, ca_pem: str) -> None:
    kit.registry.registry.publish(
        f"{kit.namespace}-ca", (Path(__file__).parents[2] / "config/samples/mini.pb").read_bytes()
    )
    await kit.secret("broken-ca", {"ca.crt": "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"})
    await kit.servegraph("ca", f"{kit.namespace}-ca", caBundle={"secretRef": {"name": "broken-ca"}})
    cond = await kit.wait_condition("ca", "Fetched", "False", "InvalidCABundle")
    assert cond["message"] == "the CA bundle is not valid PEM certificates"
    await kit.secret("broken-ca", {"ca.crt": ca_pem})  # fixed; nobody touches the ServeGraph
    await kit.wait_condition("ca", "Fetched", "True", "Downloaded", within=60)
    await kit.wait_condition("ca", "Applied", "True")


async def test_a_redirect_to_a_bad_port_is_a_condition(kit: Kit, server_ssl: ssl.SSLContext) -> None:
    async def redirect(_: web.Request) -> web.Response:
        return web.Response(status=307, headers={"Location": "https://127.0.0.1:99999/v1/graphs/x"})

    app = web.Application()
    app.router.add_get("/v1/graphs/x", redirect)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl).start()
    try:
        await kit.servegraph("port", "x", url=f"https://127.0.0.1:{runner.addresses[0][1]}/v1/graphs/x")
        cond = await kit.wait_condition("port", "Fetched", "False", "InvalidURL")
    finally:
        await runner.cleanup()
    assert "redirects to an invalid URL" in cond["message"]


async def test_fetch_downloads_as_the_operator_does(registry: RegistryServer, ca_pem: str, tmp_path: Path) -> None:
    mini = (Path(__file__).parents[2] / "config/samples/mini.pb").read_bytes()
    registry.registry.publish("cli", mini)
    cli = registry.url("cli")
    out = await asyncio.to_thread(fetch_cli, tmp_path, cli, "--allow-network", "127.0.0.0/8", ca_pem=ca_pem)
    assert out.returncode == 0, out.stderr
    assert "graph 'mini' version '1' sha256 " in out.stdout and "1 applications, 2 nodes" in out.stdout
    refused = await asyncio.to_thread(fetch_cli, tmp_path, cli, ca_pem=ca_pem)  # loopback without the exception
    assert refused.returncode == 3 and "SourceRefused" in refused.stderr
    verbose = await asyncio.to_thread(fetch_cli, tmp_path, cli, "-v", ca_pem=ca_pem)
    assert "detail: " in verbose.stderr and "loopback" in verbose.stderr
    assert REGISTRY_TOKEN not in out.stdout + out.stderr + verbose.stderr
