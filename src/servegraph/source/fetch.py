"""Download a graph from the registry: bearer token, ETag, limits, retries, TLS.

The token is a secret end to end: it is sent only to the host the ServeGraph
names (a redirect to another host drops it), and no message built here ever
contains it, nor the URL's userinfo or query (where people put tokens too).

One deadline covers a whole download: every redirect hop, every retry and every
backoff between them (a tenant must not hold a worker for hours with six hops,
four retries and a ten-minute timeout each). Everything that fails before a
registry answers (refused, reset, unresolvable, TLS not trusted, no answer in
time) is one reason with one message, `Unreachable`, so that the status is not
a port scanner: which of these it was goes to `FetchError.detail`, for the
operator's log only.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import random
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime

import aiohttp
import yarl

from servegraph.source.guard import SourcePolicy, SourceRefused, forbidden_cause, refusal_message, safe_url

REDIRECTS = frozenset({301, 302, 303, 307, 308})
RETRYABLE = frozenset({429, 500, 502, 503, 504})
MAX_REDIRECTS = 5
CHUNK = 64 * 1024
MiB = 1024 * 1024


class FetchError(Exception):
    """A download failed; `reason` is a CamelCase word for conditions and metrics.

    The message is what a tenant sees (status, Events); `detail` adds what only the
    administrator may see (the operator's log, `servegraph fetch -v`). Neither ever
    holds the token.
    """

    def __init__(
        self,
        reason: str,
        message: str,
        *,
        retryable: bool,
        status: int | None = None,
        retry_after: float | None = None,
        detail: str = "",
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.retryable = retryable
        self.status = status
        self.retry_after = retry_after
        self.detail = detail or message


@dataclass(frozen=True)
class Limits:
    """The administrator's ceilings on one download, whatever a ServeGraph asks for.

    `max_bytes` stays well below what the operator's memory holds (a body is kept
    whole while it is hashed and parsed, by at most `workers` downloads at once);
    `deadline_s` bounds the time one download can hold a worker.
    """

    max_bytes: int = 16 * MiB
    deadline_s: float = 60.0

    def clamp(self, timeout_s: float, max_bytes: int) -> tuple[float, int]:
        return min(timeout_s, self.deadline_s), min(max_bytes, self.max_bytes)


@dataclass(frozen=True)
class FetchRequest:
    url: str
    token: str = field(repr=False)
    etag: str | None = None
    timeout_s: float = 30.0
    """The deadline of the whole download: all redirects, retries and backoffs."""
    max_bytes: int = 16 * MiB
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


class RegistryClient:
    """Downloads graphs under one `SourcePolicy`: the operator's and `servegraph fetch`'s only way out.

    The session's connector applies the policy to every connection, so no caller
    can download around it. One client serves every tenant, so it keeps nothing from
    one download to the next but pooled connections: no cookies.
    """

    def __init__(
        self,
        policy: SourcePolicy | None = None,
        *,
        observe: Observer | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.policy = policy or SourcePolicy()
        self.observe = observe
        self.sleep = sleep
        # No session timeout: the request's deadline governs, over every hop and retry.
        # No cookie jar: the session serves every tenant, and a cookie one registry sets
        # (for a parent domain, or for a host whose other ports answer too) would go
        # with another tenant's token, or to another server on a redirect.
        self.session = aiohttp.ClientSession(
            connector=self.policy.connector(), timeout=aiohttp.ClientTimeout(), cookie_jar=aiohttp.DummyCookieJar()
        )

    async def close(self) -> None:
        await self.session.close()

    async def __aenter__(self) -> RegistryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def fetch(self, req: FetchRequest) -> Fetched:
        """GET with retries on 5xx/429/unreachable, exponential backoff with full jitter, all
        within `req.timeout_s`. Raises FetchError and nothing else."""
        where = safe_url(req.url)
        try:
            return await self._fetch(req)
        except FetchError:
            raise
        except Exception as exc:  # a bug or an aiohttp surprise: still one condition, never the token
            failure = FetchError(
                "FetchFailed", f"download from {where} failed", retryable=True, detail=type(exc).__name__
            )
        raise failure  # outside the handler: see `_attempt`

    async def _fetch(self, req: FetchRequest) -> Fetched:
        token = check_token(req.token)
        try:
            context = ssl_context(req.ca_pem)
        except (ssl.SSLError, ValueError) as exc:
            raise FetchError(
                "InvalidCABundle",
                "the CA bundle is not valid PEM certificates",
                retryable=False,
                detail=getattr(exc, "reason", None) or type(exc).__name__,
            ) from None
        url = self._check(req.url, req.allow_insecure_http)
        deadline = asyncio.get_running_loop().time() + req.timeout_s
        last: FetchError | None = None
        for attempt in range(req.attempts):
            start = time.monotonic()
            state = _Attempt(url)
            try:
                async with asyncio.timeout_at(deadline):
                    result = await self._attempt(req, token, context, state)
            except TimeoutError:
                error = _timed_out(req, state)
            except FetchError as failed:
                error = failed
            else:
                if self.observe:
                    self.observe(result.status, time.monotonic() - start, len(result.body))
                return result
            if self.observe:
                self.observe(error.status, time.monotonic() - start, 0)
            last = error
            remaining = deadline - asyncio.get_running_loop().time()
            if not error.retryable or attempt + 1 == req.attempts or remaining <= 0:
                raise error
            delay = error.retry_after
            if delay is None:
                delay = random.uniform(0, min(req.max_backoff_s, req.backoff_s * 2**attempt))  # noqa: S311 - jitter
            delay = min(delay, req.max_backoff_s)
            if delay >= remaining:
                raise error  # the next try could not even start before the deadline
            await self.sleep(delay)
        assert last is not None  # the loop either returns or raises
        raise last

    def _check(self, url: str, allow_insecure_http: bool) -> yarl.URL:
        try:
            return self.policy.check_url(url, allow_insecure_http)
        except SourceRefused as exc:
            raise FetchError(exc.reason, str(exc), retryable=False, detail=exc.detail) from None

    def _redirect(self, url: yarl.URL, location: str, allow_insecure_http: bool) -> yarl.URL:
        try:
            return self.policy.check_redirect(url, location, allow_insecure_http)
        except SourceRefused as exc:
            raise FetchError(exc.reason, str(exc), retryable=False, detail=exc.detail) from None

    async def _attempt(self, req: FetchRequest, token: str, context: ssl.SSLContext, state: _Attempt) -> Fetched:
        origin = _origin(state.url)
        for _ in range(MAX_REDIRECTS + 1):
            url = state.url
            headers = {"Accept": "application/x-protobuf, application/octet-stream"}
            if _origin(url) == origin:
                headers["Authorization"] = f"Bearer {token}"
            if req.etag:
                headers["If-None-Match"] = req.etag
            try:
                async with self.session.get(url, headers=headers, ssl=context, allow_redirects=False) as resp:
                    state.responded = True
                    if resp.status in REDIRECTS and "Location" in resp.headers:
                        try:
                            state.url = self._redirect(url, resp.headers["Location"], req.allow_insecure_http)
                        except ValueError:
                            raise FetchError(
                                "InvalidURL", f"{safe_url(str(url))} redirects to an invalid URL", retryable=False
                            ) from None
                        state.responded = False
                        continue
                    return await _response(resp, req, str(url))
            except (FetchError, TimeoutError):
                raise
            except (aiohttp.ClientError, OSError, ValueError) as exc:
                failure = _failure(url, exc)
            # Raised here, not in the handler: raised there, even `from None`, the FetchError would
            # keep aiohttp's exception as its __context__, and a ClientResponseError carries the
            # request's headers, the bearer token among them.
            raise failure
        raise FetchError(
            "TooManyRedirects", f"more than {MAX_REDIRECTS} redirects from {safe_url(req.url)}", retryable=False
        )


@dataclass
class _Attempt:
    url: yarl.URL
    responded: bool = False
    """Whether the current hop's registry answered: a timeout after that is not an oracle."""


def _failure(url: yarl.URL, exc: BaseException) -> FetchError:
    where = safe_url(str(url))
    refused = forbidden_cause(exc)
    if refused is not None:
        detail = refused.reason if not isinstance(refused, str) else "every address it resolves to is refused"
        return FetchError(
            "SourceRefused", refusal_message(where, url.raw_host or ""), retryable=False, detail=f"{where}: {detail}"
        )
    if isinstance(exc, ValueError) and not isinstance(exc, aiohttp.ClientError):
        return FetchError("InvalidURL", f"refusing {where}: not a valid URL", retryable=False)
    if isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError) and not isinstance(
        exc, aiohttp.ClientConnectorError
    ):
        return FetchError(
            "ConnectionError", f"{where} closed the connection before the whole graph arrived", retryable=True
        )
    return unreachable(where, _cause(exc))


def unreachable(where: str, detail: str) -> FetchError:
    """The one answer for every failure before a registry answers: no port-scanning oracle."""
    return FetchError(
        "Unreachable",
        f"no answer from {where}: the connection failed, timed out or was not trusted (TLS)",
        retryable=True,
        detail=f"{where}: {detail}",
    )


def _timed_out(req: FetchRequest, state: _Attempt) -> FetchError:
    where = safe_url(str(state.url))
    if not state.responded:
        return unreachable(where, f"no answer within the {req.timeout_s:g}s deadline")
    return FetchError("Timeout", f"{where} did not send the whole graph within {req.timeout_s:g}s", retryable=True)


def _cause(exc: BaseException) -> str:
    """What went wrong, for the administrator: the TLS verify message, errno text or error type."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        cert = exc.certificate_error
        return f"TLS certificate verify failed: {getattr(cert, 'verify_message', None) or cert}"
    if isinstance(exc, aiohttp.ClientSSLError):
        return f"TLS failed: {getattr(exc.__cause__, 'reason', None) or type(exc).__name__}"
    cause = getattr(exc, "os_error", None) or exc
    text = getattr(cause, "strerror", None) or getattr(cause, "reason", None)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
        # Not the length itself: it would tell a tenant the size of what any endpoint answers.
        raise FetchError(
            "TooLarge",
            f"{where} sends a body over the limit of {req.max_bytes} bytes",
            retryable=False,
            status=200,
            detail=f"{where} announced {length} bytes, over the limit of {req.max_bytes}",
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(CHUNK):
        size += len(chunk)
        if size > req.max_bytes:
            raise FetchError(
                "TooLarge",
                f"{where} sent more than the limit of {req.max_bytes} bytes; download aborted",
                retryable=False,
                status=200,
            )
        chunks.append(chunk)
    data = b"".join(chunks)
    chunks.clear()  # one copy of the body from here on
    return Fetched(False, data, resp.headers.get("ETag"), hashlib.sha256(data).hexdigest(), 200, where)


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


def _origin(url: yarl.URL) -> tuple[str, str, int | None]:
    return url.scheme, (url.raw_host or "").lower(), url.port
