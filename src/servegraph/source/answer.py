"""A registry's answer read: its status, its size limit, its pace, and the graph's digest.

The body is read as it comes, never past the size limit, and never slower than the
administrator's floor (`Limits.min_bytes_per_s`): a registry trickling a byte a second
is cut once the floor is missed, instead of holding its download for the whole deadline.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from email.utils import parsedate_to_datetime

import aiohttp

from servegraph.source.guard import safe_url
from servegraph.source.request import Fetched, FetchError, FetchRequest

RETRYABLE = frozenset({429, 500, 502, 503, 504})
CHUNK = 64 * 1024


async def response(resp: aiohttp.ClientResponse, req: FetchRequest, url: str) -> Fetched:
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
    loop = asyncio.get_running_loop()
    answered = loop.time()
    while True:
        # The latest moment the next bytes may come while the average stays above the floor.
        due = answered + req.rate_grace_s + size / req.min_bytes_per_s if req.min_bytes_per_s else None
        try:
            async with asyncio.timeout_at(due):
                chunk = await resp.content.read(CHUNK)
        except TimeoutError:
            raise FetchError(
                "TooSlow",
                f"{where} sent the graph slower than {req.min_bytes_per_s} bytes/s; download aborted",
                retryable=False,
                status=200,
            ) from None
        if not chunk:
            break
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
