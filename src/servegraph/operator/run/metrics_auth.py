"""Who may read /metrics: a bearer token the API server authenticates (TokenReview) and
authorizes for `get` on the non-resource path (SubjectAccessReview), the way
controller-runtime's metrics filter and kube-rbac-proxy do it — so Prometheus is
granted by an ordinary ClusterRole (`nonResourceURLs: [/metrics]`, verbs `get`).

Why: the metrics name every ServeGraph (namespace and name) and how its downloads and
rollouts go; any pod that can reach the operator could otherwise read them.

Verdicts are kept briefly, keyed by the token's SHA-256 (never the token itself): a
scrape every 15 s costs two reviews a minute, not eight. Made-up tokens cannot grow
memory (a bounded LRU) nor flood the API server (a few reviews in flight at most), nor
make Prometheus wait behind them: a token that is not shaped as a JWT (what Kubernetes
issues ServiceAccounts) is refused without a review; each client address may fail a few
times, then gets 429 before its token is looked at (the events endpoint's `FailedAuth`);
one address may have two reviews pending at a time; and past a few reviews waiting, a
request is answered 503 at once instead of queueing (2,000 junk tokens once queued 2,001
reviews: Prometheus's scrape waited 10.2 s, past its 10 s timeout). Prometheus's own
verdict is kept 60 s, so a scrape waits for nothing most of the time.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from servegraph.kube import KubeError
from servegraph.kube.reviews import Verdict
from servegraph.operator.run.events_endpoint import FailedAuth

log = logging.getLogger("servegraph.operator")

ALLOWED_TTL_S = 60.0
DENIED_TTL_S = 10.0
MAX_ENTRIES = 1024
MAX_IN_FLIGHT = 4
MAX_WAITING = 16
"""Reviews that may wait for one of the MAX_IN_FLIGHT; past them, 503 at once."""
MAX_PER_PEER = 2
"""Reviews one client address may have waiting or in flight: one address cannot fill the
queue before its first failures are counted (2,000 requests arrive before any review ends)."""
MAX_TOKEN = 16 * 1024
"""A ServiceAccount token is ~1 KiB; the API server's own header limit is far above what is sane."""
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+")

Review = Callable[[str, str], Awaitable[Verdict]]


def jwt_shaped(token: str) -> bool:
    """Three base64url parts, the first a JSON object naming its `alg`: how every token
    Kubernetes issues a ServiceAccount looks. Checked before a review, which costs the API
    server two calls; opaque tokens (a static token file's, a webhook's) are refused."""
    parts = token.split(".")
    if len(token) > MAX_TOKEN or len(parts) != 3 or not all(_BASE64URL.fullmatch(p) for p in parts):
        return False
    try:
        header = json.loads(base64.urlsafe_b64decode(parts[0] + "=" * (-len(parts[0]) % 4)))
    except (binascii.Error, ValueError):
        return False
    return isinstance(header, dict) and isinstance(header.get("alg"), str)


class MetricsGuard:
    """Answers (HTTP status, reason) for a request's Authorization header, path and client address."""

    def __init__(
        self, review: Review, clock: Callable[[], float] = time.monotonic, failures: FailedAuth | None = None
    ) -> None:
        self._review = review
        self._clock = clock
        self._verdicts: OrderedDict[str, tuple[float, Verdict]] = OrderedDict()
        self._in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)
        self._reviewing = 0
        """Requests waiting for a review or in one: at most MAX_IN_FLIGHT + MAX_WAITING."""
        self._by_peer: dict[str, int] = {}
        """The same, per client address (only addresses with some): at most MAX_PER_PEER."""
        self.failures = failures or FailedAuth(clock=clock)

    async def check(self, authorization: str | None, path: str, peer: str = "unknown") -> tuple[int, str]:
        if self.failures.blocked(peer):
            return 429, "too many failed authentications; slow down"
        status, reason = await self._decide(authorization, path, peer)
        if status in (401, 403):
            self.failures.failed(peer)
        return status, reason

    async def _decide(self, authorization: str | None, path: str, peer: str) -> tuple[int, str]:
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return 401, "a bearer token is required"
        if not jwt_shaped(token):
            return 401, "the token is not valid"
        key = hashlib.sha256(f"{path}\0{token}".encode()).hexdigest()
        verdict = self._cached(key)
        if verdict is None:
            if self._by_peer.get(peer, 0) >= MAX_PER_PEER:
                return 429, "too many token reviews at once from this address; slow down"
            if self._reviewing >= MAX_IN_FLIGHT + MAX_WAITING:
                return 503, "too many token reviews at once; try again"
            self._reviewing += 1
            self._by_peer[peer] = self._by_peer.get(peer, 0) + 1
            try:
                verdict = await self._reviewed(key, token, path)
            finally:
                self._reviewing -= 1
                if (left := self._by_peer.pop(peer) - 1) > 0:
                    self._by_peer[peer] = left
            if verdict is None:
                return 503, "the API server could not review the token"
        if verdict.allowed:
            return 200, "allowed"
        if not verdict.user:
            return 401, "the token is not valid"
        return 403, f"user {verdict.user!r} may not get {path}"

    async def _reviewed(self, key: str, token: str, path: str) -> Verdict | None:
        async with self._in_flight:
            verdict = self._cached(key)  # another request may have reviewed it meanwhile
            if verdict is not None:
                return verdict
            try:
                verdict = await self._review(token, path)
            except KubeError as exc:  # not cached: the next scrape asks again
                log.warning("cannot review a %s request: %s", path, exc)
                return None
            self._keep(key, verdict)
            return verdict

    def _cached(self, key: str) -> Verdict | None:
        entry = self._verdicts.get(key)
        if entry is None:
            return None
        if entry[0] <= self._clock():
            del self._verdicts[key]
            return None
        self._verdicts.move_to_end(key)
        return entry[1]

    def _keep(self, key: str, verdict: Verdict) -> None:
        ttl = ALLOWED_TTL_S if verdict.allowed else DENIED_TTL_S
        self._verdicts[key] = (self._clock() + ttl, verdict)
        while len(self._verdicts) > MAX_ENTRIES:
            self._verdicts.popitem(last=False)
