"""Download a graph from the registry: bearer token, ETag, size limit, retries, TLS.

The token is a secret end to end: it is sent only to the host the ServeGraph
names (a redirect to another host drops it), and no message built here ever
contains it, nor the URL's userinfo or query (where people put tokens too).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import random
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from urllib.parse import urljoin, urlsplit, urlunsplit

import aiohttp

from servegraph.source.guard import ForbiddenAddress, HostGuard

REDIRECTS = frozenset({301, 302, 303, 307, 308})
RETRYABLE = frozenset({429, 500, 502, 503, 504})
MAX_REDIRECTS = 5
CHUNK = 64 * 1024


class FetchError(Exception):
    """A download failed; `reason` is a CamelCase word for conditions and metrics."""

    def __init__(
        self, reason: str, message: str, *, retryable: bool, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.retryable = retryable
        self.status = status
        self.retry_after = retry_after


@dataclass(frozen=True)
class FetchRequest:
    url: str
    token: str
    etag: str | None = None
    timeout_s: float = 30.0
    max_bytes: int = 16 * 1024 * 1024
    ca_pem: str | None = None
    allow_insecure_http: bool = False
    attempts: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0


@dataclass(frozen=True)
class Fetched:
    """A 200 (body set) or a 304 (`not_modified`, body empty)."""

    not_modified: bool
    body: bytes
    etag: str | None
    digest: str
    status: int
    url: str


Observer = Callable[[int | None, float, int], None]
"""Called after each attempt with (status or None on connection error, seconds, bytes)."""


def safe_url(url: str) -> str:
    """The URL without userinfo, query or fragment, fit for logs and status."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


@functools.lru_cache(maxsize=64)
def ssl_context(ca_pem: str | None) -> ssl.SSLContext:
    """Verified TLS: the system CAs, or only the given bundle.

    Cached: building a context costs milliseconds, and aiohttp pools connections
    per context, so one context per bundle is what lets downloads reuse them.
    """
    if ca_pem:
        return ssl.create_default_context(cadata=ca_pem)
    return ssl.create_default_context()


def check_token(token: str) -> str:
    """Strip the newline Secrets often carry; refuse what would break the header."""
    token = token.strip()
    if not token:
        raise FetchError("TokenInvalid", "the token in the Secret is empty", retryable=False)
    if any(c in token for c in "\r\n\0") or not token.isascii():
        raise FetchError(
            "TokenInvalid", "the token in the Secret contains characters a header cannot carry", retryable=False
        )
    return token


async def fetch(
    session: aiohttp.ClientSession,
    req: FetchRequest,
    *,
    guard: HostGuard | None = None,
    observe: Observer | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Fetched:
    """GET with retries on 5xx/429/connection errors, exponential backoff with full jitter.

    Give the session a `guarded_connector()` so that the addresses a DNS name
    resolves to are checked too; `guard` checks each hop's host name.
    """
    token = check_token(req.token)
    guard = guard or HostGuard()
    last: FetchError | None = None
    for attempt in range(req.attempts):
        start = time.monotonic()
        try:
            result = await _attempt(session, req, token, guard)
        except FetchError as exc:
            if observe:
                observe(exc.status, time.monotonic() - start, 0)
            last = exc
            if not exc.retryable or attempt + 1 == req.attempts:
                raise
            delay = exc.retry_after
            if delay is None:
                delay = random.uniform(0, min(req.max_backoff_s, req.backoff_s * 2**attempt))  # noqa: S311 - jitter, not crypto
            await sleep(min(delay, req.max_backoff_s))
            continue
        if observe:
            observe(result.status, time.monotonic() - start, len(result.body))
        return result
    assert last is not None  # the loop either returns or raises
    raise last


async def _attempt(session: aiohttp.ClientSession, req: FetchRequest, token: str, guard: HostGuard) -> Fetched:
    url = req.url
    origin = _origin(url)
    timeout = aiohttp.ClientTimeout(total=req.timeout_s)
    context = ssl_context(req.ca_pem)
    for _ in range(MAX_REDIRECTS + 1):
        _check_url(url, req.allow_insecure_http)
        refusal = guard.refusal(urlsplit(url).hostname or "")
        if refusal:
            raise FetchError("SourceRefused", f"refusing {safe_url(url)}: {refusal}", retryable=False)
        headers = {"Accept": "application/x-protobuf, application/octet-stream"}
        if _origin(url) == origin:
            headers["Authorization"] = f"Bearer {token}"
        if req.etag:
            headers["If-None-Match"] = req.etag
        try:
            async with session.get(url, headers=headers, timeout=timeout, ssl=context, allow_redirects=False) as resp:
                if resp.status in REDIRECTS and "Location" in resp.headers:
                    url = urljoin(url, resp.headers["Location"])
                    continue
                return await _response(resp, req, url)
        except FetchError:
            raise
        except TimeoutError:
            raise FetchError(
                "Timeout", f"no complete answer from {safe_url(url)} within {req.timeout_s:g}s", retryable=True
            ) from None
        except aiohttp.ClientSSLError as exc:
            raise FetchError(
                "TLSError", f"TLS to {safe_url(url)} failed: {_ssl_reason(exc)}", retryable=False
            ) from None
        except (aiohttp.ClientError, OSError) as exc:
            refused = _forbidden_cause(exc)
            if refused is not None:
                raise FetchError("SourceRefused", f"refusing {safe_url(url)}: {refused}", retryable=False) from None
            raise FetchError(
                "ConnectionError", f"cannot reach {safe_url(url)}: {type(exc).__name__}", retryable=True
            ) from None
    raise FetchError(
        "TooManyRedirects", f"more than {MAX_REDIRECTS} redirects from {safe_url(req.url)}", retryable=False
    )


async def _response(resp: aiohttp.ClientResponse, req: FetchRequest, url: str) -> Fetched:
    where = safe_url(url)
    if resp.status == 304:
        return Fetched(True, b"", req.etag, "", 304, where)
    if resp.status != 200:
        raise FetchError(
            _reason(resp.status),
            f"{where} answered HTTP {resp.status}",
            retryable=resp.status in RETRYABLE,
            status=resp.status,
            retry_after=_retry_after(resp.headers.get("Retry-After")),
        )
    length = resp.content_length
    if length is not None and length > req.max_bytes:
        raise FetchError(
            "TooLarge", f"{where} sends {length} bytes, over the limit of {req.max_bytes}", retryable=False, status=200
        )
    body = bytearray()
    async for chunk in resp.content.iter_chunked(CHUNK):
        body += chunk
        if len(body) > req.max_bytes:
            raise FetchError(
                "TooLarge",
                f"{where} sent more than the limit of {req.max_bytes} bytes; download aborted",
                retryable=False,
                status=200,
            )
    data = bytes(body)
    return Fetched(False, data, resp.headers.get("ETag"), hashlib.sha256(data).hexdigest(), 200, where)


def _forbidden_cause(exc: BaseException) -> ForbiddenAddress | None:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ForbiddenAddress):
            return seen
        seen = getattr(seen, "os_error", None) or seen.__cause__ or seen.__context__
    return None


def _reason(status: int) -> str:
    return {401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 429: "RateLimited"}.get(status, f"HTTP{status}")


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


def _check_url(url: str, allow_insecure_http: bool) -> None:
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        raise FetchError(
            "InvalidURL",
            f"refusing {safe_url(url)}: credentials in the URL; put the token in the Secret",
            retryable=False,
        )
    if parts.scheme == "https" or (parts.scheme == "http" and allow_insecure_http):
        return
    raise FetchError(
        "InsecureURL", f"refusing {safe_url(url)}: only https:// (or http:// with allowInsecureHTTP)", retryable=False
    )


def _ssl_reason(exc: aiohttp.ClientSSLError) -> str:
    cause = getattr(exc, "certificate_error", None) or exc.__cause__ or exc
    return getattr(cause, "verify_message", None) or getattr(cause, "reason", None) or type(cause).__name__
