"""The registry client against a real HTTPS server on loopback with a real bearer check."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
from support import REGISTRY_TOKEN as TOKEN

from servegraph.registry.server import Fault, Registry, RegistryServer, etag_of
from servegraph.source import FetchError, FetchRequest, fetch

BODY = b"\x0a\x04mini" + bytes(range(256)) * 40  # any bytes: the client does not parse


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def request(url: str, ca_pem: str, **kw: object) -> FetchRequest:
    defaults: dict[str, object] = {"backoff_s": 0.01, "timeout_s": 5.0}
    defaults.update(kw)
    return FetchRequest(url=url, token=TOKEN + "\n", ca_pem=ca_pem, **defaults)  # type: ignore[arg-type]


async def test_download_with_bearer_and_etag(
    registry: RegistryServer, session: aiohttp.ClientSession, ca_pem: str
) -> None:
    etag = registry.registry.publish("g", BODY)
    got = await fetch(session, request(registry.url("g"), ca_pem))
    assert (got.not_modified, got.body, got.etag, got.status) == (False, BODY, etag, 200)
    assert got.digest == hashlib.sha256(BODY).hexdigest()
    assert registry.registry.requests[-1]["authorization"] == f"Bearer {TOKEN}"  # newline from the Secret stripped

    again = await fetch(session, request(registry.url("g"), ca_pem, etag=etag))
    assert again.not_modified and again.body == b"" and again.status == 304
    assert registry.registry.requests[-1]["if_none_match"] == etag


async def test_wrong_token_is_not_retried(
    registry: RegistryServer, session: aiohttp.ClientSession, ca_pem: str
) -> None:
    registry.registry.publish("g", BODY)
    req = FetchRequest(url=registry.url("g"), token="wrong", ca_pem=ca_pem, backoff_s=0.01)
    with pytest.raises(FetchError) as err:
        await fetch(session, req)
    assert (err.value.reason, err.value.status, err.value.retryable) == ("Forbidden", 403, False)
    assert len(registry.registry.requests) == 1


async def test_5xx_is_retried_until_it_recovers(
    registry: RegistryServer, session: aiohttp.ClientSession, ca_pem: str
) -> None:
    registry.registry.publish("g", BODY)
    registry.registry.faults["g"] = Fault(status=503, times=2)
    seen: list[int | None] = []
    got = await fetch(session, request(registry.url("g"), ca_pem), observe=lambda status, _s, _b: seen.append(status))
    assert got.body == BODY
    assert seen == [503, 503, 200]


async def test_retry_gives_up_after_attempts(
    registry: RegistryServer, session: aiohttp.ClientSession, ca_pem: str
) -> None:
    registry.registry.publish("g", BODY)
    registry.registry.faults["g"] = Fault(status=500, times=10)
    with pytest.raises(FetchError) as err:
        await fetch(session, request(registry.url("g"), ca_pem, attempts=3))
    assert err.value.reason == "HTTP500" and err.value.retryable
    assert len(registry.registry.requests) == 3


async def test_429_honours_retry_after(registry: RegistryServer, session: aiohttp.ClientSession, ca_pem: str) -> None:
    registry.registry.publish("g", BODY)
    registry.registry.faults["g"] = Fault(status=429, times=1, retry_after="2")
    delays: list[float] = []

    async def record(delay: float) -> None:
        delays.append(delay)

    got = await fetch(session, request(registry.url("g"), ca_pem), sleep=record)
    assert got.body == BODY and delays == [2.0]


async def test_redirect_to_another_host_drops_the_token(
    registry: RegistryServer, session: aiohttp.ClientSession, ca_pem: str, server_ssl: object
) -> None:
    async with RegistryServer(Registry(token=TOKEN), server_ssl, host="localhost") as other:  # type: ignore[arg-type]
        other.registry.publish("g", BODY)
        registry.registry.faults["g"] = Fault(redirect_to=other.url("g"))
        with pytest.raises(FetchError) as err:
            await fetch(session, request(registry.url("g"), ca_pem))
        assert err.value.reason == "Unauthorized"
        assert other.registry.requests == [{"name": "g", "authorization": None, "if_none_match": None}]


async def test_redirect_on_the_same_host_keeps_the_token(
    registry: RegistryServer, session: aiohttp.ClientSession, ca_pem: str
) -> None:
    registry.registry.publish("new", BODY)
    registry.registry.faults["old"] = Fault(redirect_to=registry.url("new"))
    got = await fetch(session, request(registry.url("old"), ca_pem))
    assert got.body == BODY and got.url.endswith("/v1/graphs/new")


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_size_limit_aborts_the_download(
    registry: RegistryServer, session: aiohttp.ClientSession, ca_pem: str, chunked: bool
) -> None:
    registry.registry.publish("g", BODY)
    registry.registry.faults["g"] = Fault(chunked=chunked)
    with pytest.raises(FetchError) as err:
        await fetch(session, request(registry.url("g"), ca_pem, max_bytes=len(BODY) - 1))
    assert err.value.reason == "TooLarge" and not err.value.retryable
    ok = await fetch(session, request(registry.url("g"), ca_pem, max_bytes=len(BODY)))
    assert ok.body == BODY


async def test_hang_past_timeout(registry: RegistryServer, session: aiohttp.ClientSession, ca_pem: str) -> None:
    registry.registry.publish("g", BODY)
    registry.registry.faults["g"] = Fault(hang_s=3)
    with pytest.raises(FetchError) as err:
        await fetch(session, request(registry.url("g"), ca_pem, timeout_s=0.5, attempts=1))
    assert err.value.reason == "Timeout" and err.value.retryable


async def test_connection_closed_mid_body(
    registry: RegistryServer, session: aiohttp.ClientSession, ca_pem: str
) -> None:
    registry.registry.publish("g", BODY)
    registry.registry.faults["g"] = Fault(truncate=True)
    with pytest.raises(FetchError) as err:
        await fetch(session, request(registry.url("g"), ca_pem, attempts=2))
    assert err.value.reason == "ConnectionError" and err.value.retryable
    assert len(registry.registry.requests) == 2


async def test_tls_is_verified(registry: RegistryServer, session: aiohttp.ClientSession) -> None:
    registry.registry.publish("g", BODY)
    with pytest.raises(FetchError) as err:
        await fetch(session, FetchRequest(url=registry.url("g"), token=TOKEN))
    assert err.value.reason == "TLSError" and not err.value.retryable
    assert registry.registry.requests == []  # the token never left the client


async def test_plain_http_needs_explicit_opt_in(session: aiohttp.ClientSession) -> None:
    async with RegistryServer(Registry(token=TOKEN)) as plain:
        plain.registry.publish("g", BODY)
        with pytest.raises(FetchError) as err:
            await fetch(session, FetchRequest(url=plain.url("g"), token=TOKEN))
        assert err.value.reason == "InsecureURL" and plain.registry.requests == []
        got = await fetch(session, FetchRequest(url=plain.url("g"), token=TOKEN, allow_insecure_http=True))
        assert got.body == BODY


@pytest.mark.parametrize("token", ["", "  \n", "bad\r\ninjected: header"])
async def test_unusable_tokens_are_refused_without_echo(session: aiohttp.ClientSession, token: str) -> None:
    with pytest.raises(FetchError) as err:
        await fetch(session, FetchRequest(url="https://127.0.0.1:1/x", token=token))
    assert err.value.reason == "TokenInvalid"
    assert "injected" not in str(err.value)


async def test_no_error_message_carries_the_token_or_url_secrets(
    registry: RegistryServer, session: aiohttp.ClientSession, ca_pem: str
) -> None:
    with_userinfo = registry.url("missing").replace("https://", f"https://user:{TOKEN}@")
    with pytest.raises(FetchError) as refused:
        await fetch(session, request(with_userinfo, ca_pem))
    assert refused.value.reason == "InvalidURL" and TOKEN not in str(refused.value)
    url = registry.url("missing") + f"?access_token={TOKEN}"
    for fault in (None, Fault(status=500, times=9), Fault(truncate=True), Fault(hang_s=2)):
        if fault:
            registry.registry.graphs["missing"] = BODY
            registry.registry.faults["missing"] = fault
        with pytest.raises(FetchError) as err:
            await fetch(session, request(url, ca_pem, attempts=1, timeout_s=0.5))
        assert TOKEN not in str(err.value) and "access_token" not in str(err.value) and "user" not in str(err.value)
        assert registry.base_url in str(err.value)
    assert etag_of(BODY)
