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
import random
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import yarl

from servegraph.source.answer import response
from servegraph.source.guard import SourcePolicy, SourceRefused, forbidden_cause, refusal_message, safe_url
from servegraph.source.request import Fetched, FetchError, FetchRequest, Limits
from servegraph.source.trust import InvalidBundle, TrustStore

__all__ = ["FetchError", "FetchRequest", "Fetched", "Limits", "RegistryClient", "check_token"]

Observer = Callable[[int | None, float, int], None]
"""Called after each attempt with (status or None on connection error, seconds, bytes)."""


REDIRECTS = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 5


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
    one download to the next but pooled connections and the TLS contexts of CA bundles
    (by digest: the same bytes trust the same registries, whoever sends them): no cookies.
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
        self.trust = TrustStore()
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
            context = await self.trust.context(req.ca_pem)
        except InvalidBundle as exc:
            raise FetchError("InvalidCABundle", str(exc), retryable=False, detail=exc.detail) from None
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
                    return await response(resp, req, str(url))
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


def _origin(url: yarl.URL) -> tuple[str, str, int | None]:
    return url.scheme, (url.raw_host or "").lower(), url.port
