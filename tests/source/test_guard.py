"""The source-host guard: allowlist globs, link-local and metadata addresses refused
by name, by obfuscated name (through the resolver) and through redirects."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from support import REGISTRY_TOKEN

from servegraph.registry.server import Fault, RegistryServer
from servegraph.source import FetchError, FetchRequest, fetch
from servegraph.source.guard import HostGuard, forbidden_address, guarded_connector


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=guarded_connector()) as s:
        yield s


@pytest.mark.parametrize(
    ("address", "refused"),
    [
        ("169.254.169.254", True),
        ("169.254.0.1", True),
        ("fd00:ec2::254", True),
        ("fe80::1%eth0", True),
        ("::ffff:169.254.169.254", True),
        ("127.0.0.1", False),
        ("10.0.0.1", False),
        ("fd00:ec2::253", False),
        ("registry.example.com", False),
    ],
)
def test_forbidden_addresses(address: str, refused: bool) -> None:
    assert (forbidden_address(address) is not None) is refused


def test_allowlist_globs() -> None:
    guard = HostGuard(["registry.example.com", "*.graphs.example.org"])
    assert guard.refusal("registry.example.com") is None
    assert guard.refusal("REGISTRY.example.com.") is None
    assert guard.refusal("a.graphs.example.org") is None
    refusal = guard.refusal("evil.example.net")
    assert refusal is not None and "not in the allowed source hosts" in refusal
    assert HostGuard([]).refusal("anything.example") is None  # empty means the default "*"
    assert HostGuard(["*"]).refusal("169.254.169.254") is not None  # "*" never allows metadata


@pytest.mark.parametrize(
    "url",
    ["https://169.254.169.254/latest/meta-data", "https://[fd00:ec2::254]/", "https://0xA9FEA9FE/latest/meta-data"],
    ids=["literal-ipv4", "literal-ipv6", "dns-name-resolving-to-metadata"],
)
async def test_metadata_service_is_refused(session: aiohttp.ClientSession, url: str) -> None:
    with pytest.raises(FetchError) as err:
        await fetch(session, FetchRequest(url=url, token=REGISTRY_TOKEN, attempts=3, timeout_s=2))
    assert err.value.reason == "SourceRefused" and not err.value.retryable
    assert "link-local or cloud metadata" in str(err.value)


async def test_redirect_to_metadata_is_refused(
    session: aiohttp.ClientSession, registry: RegistryServer, ca_pem: str
) -> None:
    registry.registry.publish("g", b"x")
    registry.registry.faults["g"] = Fault(redirect_to="https://169.254.169.254/latest/meta-data")
    with pytest.raises(FetchError) as err:
        await fetch(session, FetchRequest(url=registry.url("g"), token=REGISTRY_TOKEN, ca_pem=ca_pem))
    assert err.value.reason == "SourceRefused"
    assert len(registry.registry.requests) == 1


async def test_allowlist_applies_to_every_hop(
    session: aiohttp.ClientSession, registry: RegistryServer, ca_pem: str
) -> None:
    registry.registry.publish("g", b"graph")
    guard = HostGuard(["127.0.0.1"])
    got = await fetch(session, FetchRequest(url=registry.url("g"), token=REGISTRY_TOKEN, ca_pem=ca_pem), guard=guard)
    assert got.body == b"graph"
    registry.registry.faults["g"] = Fault(redirect_to=registry.url("g").replace("127.0.0.1", "localhost"))
    with pytest.raises(FetchError) as err:
        await fetch(session, FetchRequest(url=registry.url("g"), token=REGISTRY_TOKEN, ca_pem=ca_pem), guard=guard)
    assert err.value.reason == "SourceRefused" and "host localhost is not in the allowed source hosts" in str(err.value)
