"""Who may read /metrics: a bearer token the API server authenticates (TokenReview) and
authorizes for `get` on the non-resource path (SubjectAccessReview), the way
controller-runtime's metrics filter and kube-rbac-proxy do it — so Prometheus is
granted by an ordinary ClusterRole (`nonResourceURLs: [/metrics]`, verbs `get`).

Why: the metrics name every ServeGraph (namespace and name) and how its downloads and
rollouts go; any pod that can reach the operator could otherwise read them.

Verdicts are kept briefly, keyed by the token's SHA-256 (never the token itself): a
scrape every 15 s costs two reviews a minute, not eight. Made-up tokens cannot grow
memory (a bounded LRU) nor flood the API server (a few reviews in flight at most).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from servegraph.kube import KubeError
from servegraph.kube.reviews import Verdict

log = logging.getLogger("servegraph.operator")

ALLOWED_TTL_S = 60.0
DENIED_TTL_S = 10.0
MAX_ENTRIES = 1024
MAX_IN_FLIGHT = 4

Review = Callable[[str, str], Awaitable[Verdict]]


class MetricsGuard:
    """Answers (HTTP status, reason) for a request's Authorization header and path."""

    def __init__(self, review: Review, clock: Callable[[], float] = time.monotonic) -> None:
        self._review = review
        self._clock = clock
        self._verdicts: OrderedDict[str, tuple[float, Verdict]] = OrderedDict()
        self._in_flight = asyncio.Semaphore(MAX_IN_FLIGHT)

    async def check(self, authorization: str | None, path: str) -> tuple[int, str]:
        scheme, _, token = (authorization or "").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return 401, "a bearer token is required"
        key = hashlib.sha256(f"{path}\0{token}".encode()).hexdigest()
        verdict = self._cached(key)
        if verdict is None:
            async with self._in_flight:
                verdict = self._cached(key)  # another request may have reviewed it meanwhile
                if verdict is None:
                    try:
                        verdict = await self._review(token, path)
                    except KubeError as exc:  # not cached: the next scrape asks again
                        log.warning("cannot review a %s request: %s", path, exc)
                        return 503, "the API server could not review the token"
                    self._keep(key, verdict)
        if verdict.allowed:
            return 200, "allowed"
        if not verdict.user:
            return 401, "the token is not valid"
        return 403, f"user {verdict.user!r} may not get {path}"

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
