"""The registry client against a real HTTPS server on loopback with a real bearer check."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import ssl
import struct
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from support import REGISTRY_TOKEN as TOKEN

from servegraph.source import FetchError, FetchRequest, RegistryClient, SourcePolicy
from servegraph_testbed.registry import Fault, Registry, RegistryServer, etag_of

MiB = 1024 * 1024
BODY = b"\x0a\x04mini" + bytes(range(256)) * 40  # any bytes: the client does not parse
# The test registry listens on loopback, which the default policy refuses: an admin's exception.
LOOPBACK = SourcePolicy.build(allowed_networks=["127.0.0.0/8", "::1/128"])


@pytest.fixture
async def client() -> AsyncIterator[RegistryClient]:
    async with RegistryClient(LOOPBACK) as c:
        yield c


def request(url: str, ca_pem: str, **kw: object) -> FetchRequest:
    defaults: dict[str, object] = {"backoff_s": 0.01, "timeout_s": 5.0}
    defaults.update(kw)
    return FetchRequest(url=url, token=TOKEN + "\n", ca_pem=ca_pem, **defaults)  # type: ignore[arg-type]


async def test_download_with_bearer_and_etag(registry: RegistryServer, client: RegistryClient, ca_pem: str) -> None:
    etag = registry.registry.publish("g", BODY)
    got = await client.fetch(request(registry.url("g"), ca_pem))
    assert (got.not_modified, got.body, got.etag, got.status) == (False, BODY, etag, 200)
    assert got.digest == hashlib.sha256(BODY).hexdigest()
    assert registry.registry.requests[-1]["authorization"] == f"Bearer {TOKEN}"  # newline from the Secret stripped

    again = await client.fetch(request(registry.url("g"), ca_pem, etag=etag))
    assert again.not_modified and again.body == b"" and again.status == 304
    assert registry.registry.requests[-1]["if_none_match"] == etag


async def test_wrong_token_is_not_retried(registry: RegistryServer, client: RegistryClient, ca_pem: str) -> None:
    registry.registry.publish("g", BODY)
    req = FetchRequest(url=registry.url("g"), token="wrong", ca_pem=ca_pem, backoff_s=0.01)
    with pytest.raises(FetchError) as err:
        await client.fetch(req)
    assert (err.value.reason, err.value.status, err.value.retryable) == ("Forbidden", 403, False)
    assert len(registry.registry.requests) == 1


async def test_5xx_is_retried_until_it_recovers(registry: RegistryServer, ca_pem: str) -> None:
    registry.registry.publish("g", BODY)
    registry.registry.faults["g"] = Fault(status=503, times=2)
    seen: list[int | None] = []
    async with RegistryClient(LOOPBACK, observe=lambda status, _s, _b: seen.append(status)) as client:
        got = await client.fetch(request(registry.url("g"), ca_pem))
    assert got.body == BODY
    assert seen == [503, 503, 200]


async def test_retry_gives_up_after_attempts(registry: RegistryServer, client: RegistryClient, ca_pem: str) -> None:
    registry.registry.publish("g", BODY)
    registry.registry.faults["g"] = Fault(status=500, times=10)
    with pytest.raises(FetchError) as err:
        await client.fetch(request(registry.url("g"), ca_pem, attempts=3))
    assert err.value.reason == "HTTP500" and err.value.retryable
    assert len(registry.registry.requests) == 3


async def test_429_honours_retry_after(registry: RegistryServer, ca_pem: str) -> None:
    registry.registry.publish("g", BODY)
    registry.registry.faults["g"] = Fault(status=429, times=1, retry_after="2")
    delays: list[float] = []

    async def record(delay: float) -> None:
        delays.append(delay)

    async with RegistryClient(LOOPBACK, sleep=record) as client:
        got = await client.fetch(request(registry.url("g"), ca_pem))
    assert got.body == BODY and delays == [2.0]


async def test_a_retry_after_past_the_deadline_gives_up_at_once(registry: RegistryServer, ca_pem: str) -> None:
    registry.registry.publish("g", BODY)
    registry.registry.faults["g"] = Fault(status=429, times=1, retry_after="120")
    slept: list[float] = []

    async def record(delay: float) -> None:
        slept.append(delay)

    async with RegistryClient(LOOPBACK, sleep=record) as client:
        with pytest.raises(FetchError) as err:
            await client.fetch(request(registry.url("g"), ca_pem, timeout_s=5.0, max_backoff_s=300))
    assert err.value.reason == "RateLimited" and slept == []


async def test_redirect_to_another_host_drops_the_token(
    registry: RegistryServer, client: RegistryClient, ca_pem: str, server_ssl: object
) -> None:
    async with RegistryServer(Registry(token=TOKEN), server_ssl, host="localhost") as other:  # type: ignore[arg-type]
        other.registry.publish("g", BODY)
        registry.registry.faults["g"] = Fault(redirect_to=other.url("g"))
        with pytest.raises(FetchError) as err:
            await client.fetch(request(registry.url("g"), ca_pem))
        assert err.value.reason == "Unauthorized"
        assert other.registry.requests == [{"name": "g", "authorization": None, "if_none_match": None}]


async def test_redirect_on_the_same_host_keeps_the_token(
    registry: RegistryServer, client: RegistryClient, ca_pem: str
) -> None:
    registry.registry.publish("new", BODY)
    registry.registry.faults["old"] = Fault(redirect_to=registry.url("new"))
    got = await client.fetch(request(registry.url("old"), ca_pem))
    assert got.body == BODY and got.url.endswith("/v1/graphs/new")


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_size_limit_aborts_the_download(
    registry: RegistryServer, client: RegistryClient, ca_pem: str, chunked: bool
) -> None:
    registry.registry.publish("g", BODY)
    registry.registry.faults["g"] = Fault(chunked=chunked)
    with pytest.raises(FetchError) as err:
        await client.fetch(request(registry.url("g"), ca_pem, max_bytes=len(BODY) - 1))
    assert err.value.reason == "TooLarge" and not err.value.retryable
    assert str(len(BODY)) not in str(err.value), "a tenant learns the size of what answered"
    ok = await client.fetch(request(registry.url("g"), ca_pem, max_bytes=len(BODY)))
    assert ok.body == BODY


async def test_hang_before_answering_is_unreachable(
    registry: RegistryServer, client: RegistryClient, ca_pem: str
) -> None:
    registry.registry.publish("g", BODY)
    registry.registry.faults["g"] = Fault(hang_s=3)
    with pytest.raises(FetchError) as err:
        await client.fetch(request(registry.url("g"), ca_pem, timeout_s=0.5, attempts=1))
    assert err.value.reason == "Unreachable" and err.value.retryable
    assert "no answer within the 0.5s deadline" in err.value.detail


async def test_a_body_slower_than_the_deadline_is_a_timeout(
    registry: RegistryServer, client: RegistryClient, ca_pem: str
) -> None:
    registry.registry.publish("g", BODY)
    registry.registry.faults["g"] = Fault(stall_body_s=3)
    with pytest.raises(FetchError) as err:
        await client.fetch(request(registry.url("g"), ca_pem, timeout_s=0.5, attempts=1))
    assert err.value.reason == "Timeout"
    assert str(err.value) == f"{registry.url('g')} did not send the whole graph within 0.5s"


async def test_a_registry_trickling_its_body_is_cut_at_the_floor_not_the_deadline(
    registry: RegistryServer, client: RegistryClient, ca_pem: str
) -> None:
    """Issue 45: a registry that answers and then sends a few bytes a second held its download
    (and, then, a reconcile worker) until the deadline; below the administrator's floor it is
    cut once the grace has passed."""
    registry.registry.publish("g", BODY)
    registry.registry.faults["g"] = Fault(trickle_bytes_per_s=200)
    start = time.monotonic()
    with pytest.raises(FetchError) as err:
        await client.fetch(
            request(registry.url("g"), ca_pem, timeout_s=30, attempts=1, min_bytes_per_s=2048, rate_grace_s=0.5)
        )
    took = time.monotonic() - start
    assert err.value.reason == "TooSlow" and not err.value.retryable
    assert str(err.value) == f"{registry.url('g')} sent the graph slower than 2048 bytes/s; download aborted"
    assert took < 10, f"cut after {took:.1f} s: the floor did not hold (the deadline is 30 s)"


async def test_a_body_at_a_fair_pace_passes_the_floor(
    registry: RegistryServer, client: RegistryClient, ca_pem: str
) -> None:
    registry.registry.publish("g", BODY)
    registry.registry.faults["g"] = Fault(trickle_bytes_per_s=len(BODY) * 2)  # the whole body in half a second
    got = await client.fetch(
        request(registry.url("g"), ca_pem, timeout_s=30, attempts=1, min_bytes_per_s=1024, rate_grace_s=2)
    )
    assert got.body == BODY


async def test_one_deadline_covers_every_hop_and_retry(
    registry: RegistryServer, client: RegistryClient, ca_pem: str
) -> None:
    """Five redirects that each answer just under a second, then a 503, four attempts: with a
    timeout per hop and per attempt that was 4 x 6 x 0.9 s and more; one deadline ends it at 1.5 s."""
    registry.registry.publish("g5", BODY)
    for i in range(5):
        registry.registry.faults[f"g{i}"] = Fault(hang_s=0.9, redirect_to=registry.url(f"g{i + 1}"))
    registry.registry.faults["g5"] = Fault(hang_s=0.9, status=503, times=100)
    start = time.monotonic()
    with pytest.raises(FetchError) as err:
        await client.fetch(request(registry.url("g0"), ca_pem, timeout_s=1.5, attempts=4, backoff_s=0.01))
    elapsed = time.monotonic() - start
    assert elapsed < 1.5 + 0.5, f"the download took {elapsed:.1f} s past a 1.5 s deadline"
    assert err.value.reason == "Unreachable" and "deadline" in err.value.detail
    assert len(registry.registry.requests) <= 2, "no hop was started after the deadline"


async def test_connection_closed_mid_body(registry: RegistryServer, client: RegistryClient, ca_pem: str) -> None:
    registry.registry.publish("g", BODY)
    registry.registry.faults["g"] = Fault(truncate=True)
    with pytest.raises(FetchError) as err:
        await client.fetch(request(registry.url("g"), ca_pem, attempts=2))
    assert err.value.reason == "ConnectionError" and err.value.retryable
    assert len(registry.registry.requests) == 2
    # aiohttp's exception is not chained on, even suppressed: some of its kinds (ClientResponseError)
    # carry the request's headers, the bearer token among them.
    assert err.value.__context__ is None and err.value.__cause__ is None


async def test_tls_is_verified(registry: RegistryServer, client: RegistryClient) -> None:
    registry.registry.publish("g", BODY)
    with pytest.raises(FetchError) as err:
        await client.fetch(FetchRequest(url=registry.url("g"), token=TOKEN, attempts=1))
    assert err.value.reason == "Unreachable"
    assert "TLS certificate verify failed" in err.value.detail
    assert registry.registry.requests == []  # the token never left the client


async def test_a_broken_ca_bundle_is_its_own_reason(registry: RegistryServer, client: RegistryClient) -> None:
    bundle = "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n"
    with pytest.raises(FetchError) as err:
        await client.fetch(FetchRequest(url=registry.url("g"), token=TOKEN, ca_pem=bundle))
    assert (err.value.reason, err.value.retryable) == ("InvalidCABundle", False)
    assert registry.registry.requests == []


async def test_plain_http_needs_the_administrator_and_the_servegraph(client: RegistryClient) -> None:
    """allowInsecureHTTP alone is the tenant's word: without the operator's
    --allow-insecure-http-sources the status must not become an oracle for internal http."""
    async with RegistryServer(Registry(token=TOKEN)) as plain:
        plain.registry.publish("g", BODY)
        with pytest.raises(FetchError) as err:
            await client.fetch(FetchRequest(url=plain.url("g"), token=TOKEN, allow_insecure_http=True))
        assert (err.value.reason, err.value.retryable) == ("SourceRefused", False)
        assert "--allow-insecure-http-sources" in str(err.value) and plain.registry.requests == []
        admin_allows = dataclasses.replace(LOOPBACK, allow_insecure_http=True)
        async with RegistryClient(admin_allows) as allowed:
            with pytest.raises(FetchError) as err:
                await allowed.fetch(FetchRequest(url=plain.url("g"), token=TOKEN))
            assert err.value.reason == "InsecureURL" and plain.registry.requests == []
            got = await allowed.fetch(FetchRequest(url=plain.url("g"), token=TOKEN, allow_insecure_http=True))
            assert got.body == BODY


async def test_a_redirect_to_plain_http_needs_the_administrator_too(
    registry: RegistryServer, client: RegistryClient, ca_pem: str
) -> None:
    async with RegistryServer(Registry(token=TOKEN)) as plain:
        plain.registry.publish("g", BODY)
        registry.registry.faults["g"] = Fault(redirect_to=plain.url("g"))
        with pytest.raises(FetchError) as err:
            await client.fetch(request(registry.url("g"), ca_pem, allow_insecure_http=True))
        assert err.value.reason == "SourceRefused" and "--allow-insecure-http-sources" in str(err.value)
        assert plain.registry.requests == []


@pytest.mark.parametrize("token", ["", "  \n", "bad\r\ninjected: header"])
async def test_unusable_tokens_are_refused_without_echo(client: RegistryClient, token: str) -> None:
    with pytest.raises(FetchError) as err:
        await client.fetch(FetchRequest(url="https://127.0.0.1:1/x", token=token))
    assert err.value.reason == "TokenInvalid"
    assert "injected" not in str(err.value)


@pytest.mark.parametrize(
    "url",
    ["https://127.0.0.1:99999/x", "https://127.0.0.1:0/x", "https://127.0.0.1:port/x", "https:///x"],
    ids=["port-over-65535", "port-zero", "port-not-a-number", "no-host"],
)
async def test_a_malformed_url_is_a_condition_not_a_crash(client: RegistryClient, url: str) -> None:
    with pytest.raises(FetchError) as err:
        await client.fetch(FetchRequest(url=url, token=TOKEN))
    assert err.value.reason in {"InvalidURL", "SourceRefused"} and not err.value.retryable


async def test_a_redirect_to_a_malformed_url_is_a_condition_not_a_crash(
    client: RegistryClient, ca_pem: str, server_ssl: ssl.SSLContext
) -> None:
    async def redirect(_: web.Request) -> web.Response:
        return web.Response(status=307, headers={"Location": "https://127.0.0.1:99999/v1/graphs/g"})

    app = web.Application()
    app.router.add_get("/g", redirect)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl).start()
    try:
        url = f"https://127.0.0.1:{runner.addresses[0][1]}/g"
        with pytest.raises(FetchError) as err:
            await client.fetch(request(url, ca_pem))
    finally:
        await runner.cleanup()
    assert err.value.reason == "InvalidURL" and not err.value.retryable


async def test_no_error_message_carries_the_token_or_url_secrets(
    registry: RegistryServer, client: RegistryClient, ca_pem: str
) -> None:
    with_userinfo = registry.url("missing").replace("https://", f"https://user:{TOKEN}@")
    with pytest.raises(FetchError) as refused:
        await client.fetch(request(with_userinfo, ca_pem))
    assert refused.value.reason == "InvalidURL" and TOKEN not in str(refused.value)
    url = registry.url("missing") + f"?access_token={TOKEN}"
    for fault in (None, Fault(status=500, times=9), Fault(truncate=True), Fault(hang_s=2), Fault(stall_body_s=2)):
        if fault:
            registry.registry.graphs["missing"] = BODY
            registry.registry.faults["missing"] = fault
        with pytest.raises(FetchError) as err:
            await client.fetch(request(url, ca_pem, attempts=1, timeout_s=0.5))
        for text in (str(err.value), err.value.detail):
            assert TOKEN not in text and "access_token" not in text and "user" not in text
        assert registry.base_url in str(err.value)
    assert etag_of(BODY)
    await asyncio.sleep(0)


def gzip_bomb(mib: int) -> bytes:
    """`mib` MiB of zeros as one gzip member of about 1 KiB per MiB: identical flushed blocks,
    so building a 1 GiB bomb costs a CRC, not a compression of 1 GiB."""
    zeros = bytes(MiB)
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    first = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(mib):
        crc = zlib.crc32(zeros, crc)
    return first + block * (mib - 1) + c.flush()[:-8] + struct.pack("<II", crc, (mib * MiB) & 0xFFFFFFFF)


async def test_a_gzip_bomb_is_stopped_at_the_limit_in_bounded_memory(
    client: RegistryClient, ca_pem: str, server_ssl: ssl.SSLContext
) -> None:
    """1 MB on the wire, 1 GiB inflated: the size limit counts inflated bytes, and the client
    holds little more than the limit (aiohttp 3.12.0-3.13.2 peaked at 142-267 MiB here, 3.13.3-3.13.5
    at 64 MiB and reported a broken connection)."""
    bomb = gzip_bomb(1024)
    assert len(bomb) < 1_100_000
    seen: list[str] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.Response(body=bomb, headers={"Content-Encoding": "gzip", "Content-Type": "application/x-protobuf"})

    app = web.Application()
    app.router.add_get("/g", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl).start()
    limit = 16 * MiB
    tracemalloc.start()
    try:
        with pytest.raises(FetchError) as err:
            await client.fetch(request(f"https://127.0.0.1:{runner.addresses[0][1]}/g", ca_pem, max_bytes=limit))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        await runner.cleanup()
    assert (err.value.reason, err.value.retryable) == ("TooLarge", False), err.value.detail
    assert seen == ["/g"], "a bomb is not retried"
    assert peak < 2 * limit, f"peak {peak / MiB:.0f} MiB to refuse a body over {limit / MiB:.0f} MiB"
