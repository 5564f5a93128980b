"""The source policy: the URL read as the HTTP client reads it, and every address checked
where the connection is made, by default refusing everything inside the cluster's reach.

No test here sends a packet off loopback: `connections` records every connect() the
client attempts and refuses, without sending, any to a non-loopback address.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from support import REGISTRY_TOKEN

from servegraph.source import FetchError, FetchRequest, RegistryClient, SourcePolicy
from servegraph.source.guard import ForbiddenAddress, forbidden_cause
from servegraph_testbed.registry import Fault, RegistryServer

LOOPBACK = SourcePolicy.build(allowed_networks=["127.0.0.0/8", "::1/128"])
# The cluster the operator would find at start-up: its API server and its Service range.
CLUSTER = SourcePolicy.build(denied_networks=["10.96.0.0/12"], denied_endpoints=[("192.0.2.10", 6443)])


@pytest.fixture
async def connections(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[str]]:
    """Every address the event loop is asked to connect to; only loopback is let through."""
    attempted: list[str] = []
    # The running loop's class (the tests' loop): asking the policy for "the current loop"
    # fails once an earlier test's asyncio.run() has cleared it.
    loop_type = type(asyncio.get_running_loop())
    original = loop_type.sock_connect

    async def sock_connect(self: Any, sock: socket.socket, address: Any) -> None:
        attempted.append(str(address[0]))
        if not ipaddress.ip_address(str(address[0]).split("%")[0]).is_loopback:
            raise ConnectionRefusedError(111, "the test refused to send this off loopback")
        await original(self, sock, address)

    monkeypatch.setattr(loop_type, "sock_connect", sock_connect)
    yield attempted


@pytest.fixture
async def client() -> AsyncIterator[RegistryClient]:
    async with RegistryClient() as c:  # the default policy, as `servegraph run` starts with
        yield c


# -- 1. the host exactly as the client connects to it ---------------------------------


def _shifted(text: str, digits: int, dot: str = ".") -> str:
    """`text` with its ASCII digits moved to the block starting at `digits`, and its dots replaced."""
    return "".join(chr(digits + int(c)) if c.isdigit() else dot if c == "." else c for c in text)


@pytest.mark.parametrize(
    "host",
    [
        _shifted("169.254.169.254", 0xFF10, "\uff0e"),  # fullwidth digits and full stops
        "169\u3002254\u3002169\u3002254",  # ideographic full stops
        _shifted("169.254.169.254", 0x1D7CE),  # mathematical bold digits
        _shifted("169.254.169.254", 0x0660),  # Arabic-Indic digits
        "".join(chr(0x24D0 + ord(c) - ord("a")) for c in "localhost"),  # circled letters, IDNA-mapped
    ],
    ids=["fullwidth", "ideographic-dots", "math-digits", "arabic-indic", "circled-localhost"],
)
async def test_non_ascii_hosts_never_reach_an_address(
    client: RegistryClient, connections: list[str], host: str
) -> None:
    with pytest.raises(FetchError) as err:
        await client.fetch(FetchRequest(url=f"https://{host}/latest/meta-data", token=REGISTRY_TOKEN, timeout_s=3))
    assert err.value.reason == "SourceRefused" and not err.value.retryable
    assert "punycode" in str(err.value)
    assert connections == [], "the client tried to connect"


@pytest.mark.parametrize(
    "host",
    ["0xA9FEA9FE", "2852039166", "0251.0376.0251.0376", "169.254.43518", "169.254.169.254.", "%31%36%39.254.169.254"],
    ids=["hex", "integer", "octal", "short-form", "trailing-dot", "percent-encoded"],
)
async def test_numeric_and_encoded_forms_of_an_address_are_refused(
    client: RegistryClient, connections: list[str], host: str
) -> None:
    with pytest.raises(FetchError) as err:
        await client.fetch(FetchRequest(url=f"https://{host}/latest/meta-data", token=REGISTRY_TOKEN, timeout_s=3))
    assert err.value.reason == "SourceRefused"
    assert connections == []


async def test_ip_literals_are_checked_where_the_connection_is_made(registry: RegistryServer, ca_pem: str) -> None:
    """Below the URL check: the connector alone refuses a literal IDNA turned into loopback."""
    registry.registry.publish("g", b"graph")
    context = ssl.create_default_context(cadata=ca_pem)
    fullwidth = _shifted("127.0.0.1", 0xFF10, "\uff0e")
    for url in (registry.url("g"), registry.url("g").replace("127.0.0.1", fullwidth)):
        async with aiohttp.ClientSession(connector=SourcePolicy().connector()) as session:
            with pytest.raises(aiohttp.ClientConnectorError) as err:
                await session.get(url, ssl=context)
        refused = forbidden_cause(err.value)
        assert isinstance(refused, ForbiddenAddress) and refused.address == "127.0.0.1"
    assert registry.registry.requests == []


# -- 2. what the default refuses ------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("169.254.169.254", True),
        ("169.254.0.1", True),
        ("fe80::1", True),
        ("fd00:ec2::254", True),
        ("100.100.100.200", True),
        ("168.63.129.16", True),
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("0.0.0.0", True),
        ("0.1.2.3", True),
        ("::", True),
        ("224.0.0.1", True),
        ("255.255.255.255", True),
        ("::ffff:127.0.0.1", True),  # IPv4-mapped
        ("::ffff:169.254.169.254", True),
        ("::127.0.0.1", True),  # IPv4-compatible
        ("64:ff9b::a9fe:a9fe", True),  # NAT64 of 169.254.169.254
        ("64:ff9b::7f00:1", True),  # NAT64 of 127.0.0.1
        ("2002:a9fe:a9fe::1", True),  # 6to4 of 169.254.169.254
        ("2001:0:4136:e378:8000:63bf:5601:5601", True),  # Teredo whose client is 169.254.169.254 (inverted)
        ("fe80::5efe:a9fe:a9fe", True),  # ISATAP
        ("2001:db8::200:5efe:7f00:1", True),  # ISATAP of 127.0.0.1 under a global prefix
        ("fd20:ce::254", True),  # GCP metadata over IPv6
        ("fd00:ec2::23", True),  # EKS Pod Identity Agent
        ("169.254.170.23", True),
        ("::ffff:0:7f00:1", True),  # IPv4-translated (SIIT) 127.0.0.1
        ("::ffff:0:808:808", True),  # IPv4-translated: refused as a whole, whatever it carries
        ("64:ff9b:1::808:808", True),  # local-use NAT64: refused as a whole by default
        ("64:ff9b:1:a9fe:a9:fe00:808:808", True),  # ... 169.254.169.254 after a /48 prefix
        ("10.0.0.1", False),
        ("192.168.1.10", False),
        ("8.8.8.8", False),
        ("64:ff9b::808:808", False),  # NAT64 of 8.8.8.8
        ("2606:4700::1111", False),
        ("fd00:ec2::253", False),
    ],
)
def test_what_the_default_policy_refuses(address: str, refused: bool) -> None:
    assert (SourcePolicy().address_refusal(address, 443) is not None) is refused


@pytest.mark.parametrize(
    ("prefix", "address", "carries", "public"),
    [
        ("64:ff9b:1::/48", "64:ff9b:1:a9fe:a9:fe00:808:808", "169.254.169.254", "64:ff9b:1:808:8:800::"),
        ("64:ff9b:1:ab00::/56", "64:ff9b:1:aba9:fe:a9fe::", "169.254.169.254", "64:ff9b:1:ab08:8:808::"),
        ("64:ff9b:1:abcd::/64", "64:ff9b:1:abcd:a9:fea9:fe00:0", "169.254.169.254", "64:ff9b:1:abcd:8:808:800:0"),
        ("64:ff9b:1:abcd::/96", "64:ff9b:1:abcd::a9fe:a9fe", "169.254.169.254", "64:ff9b:1:abcd::808:808"),
        ("64:ff9b:1:abcd::/96", "64:ff9b:1:abcd::7f00:1", "127.0.0.1", "64:ff9b:1:abcd::808:808"),
    ],
)
def test_an_allowed_local_nat64_prefix_reads_the_ipv4_where_its_length_puts_it(
    prefix: str, address: str, carries: str, public: str
) -> None:
    """RFC 8215's local-use prefix is the administrator's translator: allowing it says its length,
    and the IPv4 at that position (RFC 6052) is checked as any address is (8.8.8.8 passes)."""
    policy = SourcePolicy.build(allowed_networks=[prefix])
    reason = policy.address_refusal(address, 443)
    assert reason is not None and reason.startswith(f"{carries} (in ")
    assert policy.address_refusal(public, 443) is None
    assert SourcePolicy().address_refusal(public, 443) is not None, "not allowed: the whole /48 is refused"


def test_the_operators_own_pod_and_the_api_servers_endpoints_are_refused_over_exceptions() -> None:
    own = ipaddress.ip_address("10.244.1.7")
    api = (ipaddress.ip_address("192.168.5.10"), 6443)
    policy = SourcePolicy.build(allowed_networks=["10.0.0.0/8", "192.168.0.0/16"]).with_denied([], [api], [own])
    for port in (8080, 8081, 443):
        assert policy.address_refusal("10.244.1.7", port) == "10.244.1.7 is the operator's own pod (10.244.1.7)"
    assert policy.address_refusal("::ffff:10.244.1.7", 8080) is not None
    assert policy.address_refusal("192.168.5.10", 6443) is not None
    assert policy.address_refusal("192.168.5.10", 8443) is None
    assert policy.address_refusal("10.244.1.8", 8080) is None  # another pod: the administrator's exception


def test_the_cluster_is_refused_and_exceptions_never_reach_metadata() -> None:
    assert CLUSTER.address_refusal("10.96.0.1", 443) is not None  # the kubernetes Service
    assert CLUSTER.address_refusal("10.100.5.6", 8080) is not None  # any Service
    assert CLUSTER.address_refusal("::ffff:10.96.0.10", 53) is not None
    assert CLUSTER.address_refusal("192.0.2.10", 6443) is not None  # the API server's endpoint
    assert CLUSTER.address_refusal("192.0.2.10", 8443) is None  # another port of that host
    assert CLUSTER.address_refusal("10.128.0.1", 443) is None  # outside the Service range
    dev = SourcePolicy.build(allowed_networks=["127.0.0.0/8", "169.254.0.0/16", "0.0.0.0/0"])
    assert dev.address_refusal("127.0.0.1", 80) is None
    assert dev.address_refusal("169.254.169.254", 80) is not None, "no exception reaches metadata"
    assert dev.address_refusal("100.100.100.200", 80) is not None


def test_an_empty_allowlist_allows_nothing() -> None:
    for policy in (SourcePolicy.build(allowed_hosts=[]), SourcePolicy.build(allowed_hosts=["", " "])):
        with pytest.raises(Exception, match=r"not in the allowed source hosts \(none\)"):
            policy.check_url("https://registry.example.com/g")


def test_allowlist_globs() -> None:
    policy = SourcePolicy.build(allowed_hosts=["registry.example.com", "*.graphs.example.org"])
    assert policy.check_url("https://REGISTRY.example.com./g").raw_host == "registry.example.com."
    assert policy.check_url("https://a.graphs.example.org/g")
    with pytest.raises(Exception, match=r"host evil\.example\.net is not in the allowed source hosts"):
        policy.check_url("https://evil.example.net/g")


async def test_a_name_resolving_to_loopback_is_refused_without_saying_where(
    registry: RegistryServer, client: RegistryClient, ca_pem: str
) -> None:
    registry.registry.publish("g", b"graph")
    url = registry.url("g").replace("127.0.0.1", "localhost")
    with pytest.raises(FetchError) as err:
        await client.fetch(FetchRequest(url=url, token=REGISTRY_TOKEN, ca_pem=ca_pem, timeout_s=3))
    assert err.value.reason == "SourceRefused"
    assert "127.0.0.1" not in str(err.value) and "::1" not in str(err.value)
    assert "loopback" in err.value.detail
    assert registry.registry.requests == []


async def _server(handler: Any) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_failed_addresses_all_read_the_same(registry: RegistryServer) -> None:
    """Closed port, a port that is not HTTPS, an untrusted certificate, a server that never
    answers: a tenant reads the same reason and message for each (no port scanner); only the
    administrator's detail tells them apart."""

    async def hang(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)

    async def close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n")
        writer.close()

    hanging, hang_port = await _server(hang)
    closing, close_port = await _server(close)
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    closed_port = probe.getsockname()[1]
    probe.close()
    try:
        results = {}
        async with RegistryClient(LOOPBACK) as client:
            for name, port in (("closed", closed_port), ("not-https", close_port), ("hangs", hang_port)):
                url = f"https://127.0.0.1:{port}/v1/graphs/g"
                with pytest.raises(FetchError) as err:
                    await client.fetch(FetchRequest(url=url, token=REGISTRY_TOKEN, timeout_s=1, attempts=1))
                results[name] = (err.value.reason, str(err.value).replace(str(port), "PORT"), err.value.detail)
            with pytest.raises(FetchError) as err:  # the registry's certificate, not trusted without its CA
                await client.fetch(FetchRequest(url=registry.url("g"), token=REGISTRY_TOKEN, timeout_s=1, attempts=1))
            port = str(registry.port)
            results["untrusted-tls"] = (err.value.reason, str(err.value).replace(port, "PORT"), err.value.detail)
    finally:
        hanging.close()
        closing.close()
    assert {(reason, message) for reason, message, _ in results.values()} == {
        (
            "Unreachable",
            "no answer from https://127.0.0.1:PORT/v1/graphs/g: the connection failed, timed out or was not trusted (TLS)",
        )
    }
    assert len({detail for _, _, detail in results.values()}) == 4, "the administrator's detail tells them apart"


async def test_redirect_to_metadata_is_refused(registry: RegistryServer, ca_pem: str, connections: list[str]) -> None:
    registry.registry.publish("g", b"x")
    registry.registry.faults["g"] = Fault(redirect_to="https://169.254.169.254/latest/meta-data")
    async with RegistryClient(LOOPBACK) as client:
        with pytest.raises(FetchError) as err:
            await client.fetch(FetchRequest(url=registry.url("g"), token=REGISTRY_TOKEN, ca_pem=ca_pem))
    assert err.value.reason == "SourceRefused"
    assert len(registry.registry.requests) == 1
    assert set(connections) == {"127.0.0.1"}


async def test_allowlist_applies_to_every_hop(registry: RegistryServer, ca_pem: str) -> None:
    registry.registry.publish("g", b"graph")
    policy = SourcePolicy.build(allowed_hosts=["127.0.0.1"], allowed_networks=["127.0.0.0/8", "::1/128"])
    async with RegistryClient(policy) as client:
        got = await client.fetch(FetchRequest(url=registry.url("g"), token=REGISTRY_TOKEN, ca_pem=ca_pem))
        assert got.body == b"graph"
        registry.registry.faults["g"] = Fault(redirect_to=registry.url("g").replace("127.0.0.1", "localhost"))
        with pytest.raises(FetchError) as err:
            await client.fetch(FetchRequest(url=registry.url("g"), token=REGISTRY_TOKEN, ca_pem=ca_pem))
    assert err.value.reason == "SourceRefused" and "host localhost is not in the allowed source hosts" in str(err.value)


@pytest.mark.parametrize(
    "host",
    ["".join(chr(0xFF41 + ord(c) - ord("a")) for c in "localhost"), _shifted("127.0.0.1", 0xFF10, "\uff0e")],
    ids=["fullwidth-name", "fullwidth-literal"],
)
async def test_a_location_header_follows_the_spec_urls_host_rule(
    ca_pem: str, server_ssl: ssl.SSLContext, host: str
) -> None:
    """One rule for both: a spec URL with a non-ASCII host is refused, so is a redirect to one
    (it was mapped by IDNA, then checked, and followed)."""
    seen: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.path)
        if request.path == "/g":
            return web.Response(status=307, headers={"Location": f"https://{host}:{port}/v1/graphs/g"})
        return web.Response(body=b"graph")

    app = web.Application()
    app.router.add_get("/{tail:.*}", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl).start()
    port = runner.addresses[0][1]
    try:
        async with RegistryClient(LOOPBACK) as client:
            with pytest.raises(FetchError) as err:
                await client.fetch(
                    FetchRequest(url=f"https://127.0.0.1:{port}/g", token=REGISTRY_TOKEN, ca_pem=ca_pem, attempts=1)
                )
    finally:
        await runner.cleanup()
    assert (err.value.reason, err.value.retryable) == ("SourceRefused", False)
    assert "punycode" in str(err.value) and host in str(err.value)
    assert seen == ["/g"], "the redirect was followed"
