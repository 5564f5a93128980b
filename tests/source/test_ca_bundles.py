"""A tenant's CA bundle against the real HTTPS registry: capped, never holding the loop, parsed once.

The bundles are real certificates (a throwaway CA each, the registry's own CA among
them). How long OpenSSL takes to read one is measured in the test itself, as one
synchronous call, and the loop's longest stall is held to a fraction of it: what the
machine costs cancels out.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Iterator

import pytest
import trustme
from support import REGISTRY_TOKEN as TOKEN

from servegraph.source import FetchError, FetchRequest, RegistryClient, SourcePolicy
from servegraph_testbed.loopstall import LoopStall
from servegraph_testbed.registry import RegistryServer

LOOPBACK = SourcePolicy.build(allowed_networks=["127.0.0.0/8", "::1/128"])
BODY = b"\x0a\x04mini graph bytes"
CERTS = 300  # the most a bundle may hold
BROKEN = "-----BEGIN CERTIFICATE-----\nTUlJQnJva2Vu\n-----END CERTIFICATE-----\n"


@pytest.fixture(scope="module")
def others() -> list[str]:
    """Certificates of CAs that are nobody's: the bulk of a large bundle."""
    return [trustme.CA().cert_pem.bytes().decode() for _ in range(CERTS - 1)]


@pytest.fixture
async def client() -> AsyncIterator[RegistryClient]:
    async with RegistryClient(LOOPBACK) as c:
        yield c


def one_call_ms(bundle: str) -> float:
    """What the bundle costs read as one call (how every download read it before): the best of three."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        with contextlib.suppress(ssl.SSLError):
            ssl.create_default_context(cadata=bundle)
        best = min(best, time.perf_counter() - start)
    return best * 1000


async def longest_stall_ms(work: Awaitable[object]) -> tuple[float, object]:
    """The loop's longest stall (`LoopStall`) while `work` runs, and its result or FetchError.

    The cyclic collector is off meanwhile (`no_collector`): in a whole test run the heap is
    large, and one full collection (100 ms, seen) is the collector's stall, not the bundle's;
    the operator runs with its collector tuned (`gcpause.tune_for_service`)."""
    with no_collector():
        async with LoopStall(settle_s=0.01) as stall:
            try:
                result: object = await work
            except FetchError as exc:
                result = exc
    return stall.worst_ms, result


@contextlib.contextmanager
def no_collector() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def test_a_bundle_over_the_size_limit_is_refused_before_anything_reads_it(
    registry: RegistryServer, client: RegistryClient, ca_pem: str
) -> None:
    registry.registry.publish("g", BODY)
    padded = ca_pem + ("# padding between blocks, which OpenSSL skips\n" * 12_000)  # 552 KB
    with pytest.raises(FetchError) as err:
        await client.fetch(FetchRequest(url=registry.url("g"), token=TOKEN, ca_pem=padded, attempts=1))
    assert (err.value.reason, str(err.value)) == ("InvalidCABundle", "the CA bundle is over the limit of 524288 bytes")
    assert registry.registry.requests == []


async def test_a_bundle_over_the_certificate_limit_is_refused(
    registry: RegistryServer, client: RegistryClient, ca_pem: str, others: list[str]
) -> None:
    registry.registry.publish("g", BODY)
    bundle = "".join([*others, others[0], ca_pem])  # 301 certificates, the registry's CA last
    with pytest.raises(FetchError) as err:
        await client.fetch(FetchRequest(url=registry.url("g"), token=TOKEN, ca_pem=bundle, attempts=1))
    assert err.value.reason == "InvalidCABundle"
    assert str(err.value) == "the CA bundle holds 301 PEM blocks, over the limit of 300 certificates"
    assert registry.registry.requests == []
    got = await client.fetch(FetchRequest(url=registry.url("g"), token=TOKEN, ca_pem="".join([*others, ca_pem])))
    assert got.body == BODY  # 300 is allowed, and trusted as one bundle


async def test_the_largest_bundle_is_read_without_holding_the_loop(
    registry: RegistryServer, client: RegistryClient, ca_pem: str, others: list[str]
) -> None:
    registry.registry.publish("g", BODY)
    bundle = "".join([*others, ca_pem])
    whole = one_call_ms(bundle)
    stall, got = await longest_stall_ms(client.fetch(FetchRequest(url=registry.url("g"), token=TOKEN, ca_pem=bundle)))
    assert not isinstance(got, FetchError), got
    assert stall < whole / 3, f"the loop stalled {stall:.1f} ms; the bundle costs {whole:.1f} ms in one call"


async def test_a_broken_bundle_is_parsed_once_however_often_it_is_downloaded(
    registry: RegistryServer, client: RegistryClient, ca_pem: str, others: list[str]
) -> None:
    """The issue's case: many good certificates and a broken last one, so every read paid for all of them."""
    registry.registry.publish("g", BODY)
    bundle = "".join([*others, BROKEN])
    whole = one_call_ms(bundle)
    request = FetchRequest(url=registry.url("g"), token=TOKEN, ca_pem=bundle)
    stall, first = await longest_stall_ms(client.fetch(request))
    assert isinstance(first, FetchError) and first.reason == "InvalidCABundle"
    assert stall < whole / 3, f"the loop stalled {stall:.1f} ms; the bundle costs {whole:.1f} ms in one call"
    with no_collector():
        started = time.perf_counter()
        for _ in range(5):  # a refresh annotation or a poll: each one another download
            with pytest.raises(FetchError) as again:
                await client.fetch(request)
            assert (again.value.reason, again.value.detail) == ("InvalidCABundle", first.detail)
        spent = (time.perf_counter() - started) * 1000
    assert spent < whole / 2, f"5 more downloads took {spent:.1f} ms; one read of the bundle costs {whole:.1f} ms"
    assert registry.registry.requests == []
    assert str(first) == "the CA bundle is not valid PEM certificates"  # and which one, for the administrator:
    assert first.detail.startswith(f"certificate {CERTS}: ")


async def test_downloads_at_once_with_one_new_bundle_read_it_once(
    registry: RegistryServer, client: RegistryClient, ca_pem: str, others: list[str]
) -> None:
    registry.registry.publish("g", BODY)
    request = FetchRequest(url=registry.url("g"), token=TOKEN, ca_pem="".join([*others[:50], ca_pem]))
    got = await asyncio.gather(*(client.fetch(request) for _ in range(4)))
    assert [g.body for g in got] == [BODY] * 4
    assert client.trust.builds == 1
