"""What one download is asked for and what it answers: the values the registry client trades in."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    whole while it is hashed and parsed, by every download at once); `deadline_s` bounds
    the time one download can take; `min_bytes_per_s` cuts a registry that trickles its
    body (counted from its answer, after `rate_grace_s`): one that sends a byte a second
    holds a download for seconds, not for the whole deadline.
    """

    max_bytes: int = 16 * MiB
    deadline_s: float = 60.0
    min_bytes_per_s: int = 16 * 1024
    rate_grace_s: float = 5.0

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
    min_bytes_per_s: int = 0
    """The body's average rate, from the registry's answer on, below which the download is
    cut (`TooSlow`) once `rate_grace_s` have passed; 0: no floor."""
    rate_grace_s: float = 5.0


@dataclass(frozen=True)
class Fetched:
    """A 200 (body set) or a 304 (`not_modified`, body empty)."""

    not_modified: bool
    body: bytes
    etag: str | None
    digest: str
    status: int
    url: str
