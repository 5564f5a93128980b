"""A canary's evidence without Prometheus: the routers' own counters, read through the serve Service.

The ingress routers of each application count, per version and per kind of caller, the
requests, the failures by the node that failed, and a latency histogram, summed across
their replicas by one named Ray actor per application (runtime/stats.py). A GET of the
application's route with `x-servegraph-stats: <token>` (the token is in the ingress
router's user_config: the operator renders it) answers the sums as JSON. The operator reads
every application of the graph through the RayService's serve Service, as any in-cluster
client would, and takes differences: the first read of a window is its baseline.

What this gives up against Prometheus: no per-node latency (the histogram is the
application's, at its ingress), and counts reset when the replica owning the actor goes
(a window that sees a counter go down starts again from that read).
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from servegraph.evidence.counts import Counts, Evidence, EvidenceError, NodeCounts, Request

STATS_HEADER = "x-servegraph-stats"
SERVE_PORT = 8000
MAX_ANSWER = 1024 * 1024
MAX_WINDOWS = 10_000
CLIENTS, MIRROR = "clients", "mirror"


@dataclass(frozen=True)
class RoutesQuery:
    """Whose counters: one URL per application (its route on the serve Service), the versions,
    the token, and the window the baseline belongs to (a new one when a step starts)."""

    urls: Mapping[str, str]
    """Application → the URL of its route."""
    token: str = field(repr=False)
    live_version: str
    canary_version: str
    window: str


@dataclass(frozen=True)
class _Totals:
    """One version's cumulative counts of one kind of caller, over every application."""

    requests: int = 0
    errors: int = 0
    failed: tuple[tuple[str, str, int], ...] = ()
    """(application, node, failures)."""
    buckets: tuple[float, ...] = ()
    counts: tuple[int, ...] = ()

    def minus(self, base: _Totals) -> _Totals:
        if self.requests < base.requests or len(self.counts) != len(base.counts):
            return self  # a counter went down (its owner replica went): the window restarts here
        before = {(a, n): c for a, n, c in base.failed}
        return _Totals(
            self.requests - base.requests,
            self.errors - base.errors,
            tuple((a, n, c - before.get((a, n), 0)) for a, n, c in self.failed),
            self.buckets,
            tuple(x - y for x, y in zip(self.counts, base.counts, strict=True)),
        )

    def to_counts(self) -> Counts:
        return Counts(self.requests, self.errors, quantile(0.99, self.buckets, self.counts))


def quantile(q: float, buckets: Sequence[float], counts: Sequence[int]) -> float | None:
    """The q-quantile of a histogram (`counts` per bucket, one more than `buckets`: above the
    last), interpolated within its bucket as Prometheus' histogram_quantile does."""
    total = sum(counts)
    if not total or len(counts) != len(buckets) + 1:
        return None
    rank = q * total
    seen = 0
    for i, count in enumerate(counts):
        if seen + count >= rank and count:
            if i == len(buckets):
                return float(buckets[-1]) if buckets else None
            lower = float(buckets[i - 1]) if i else 0.0
            return lower + (float(buckets[i]) - lower) * (rank - seen) / count
        seen += count
    return float(buckets[-1]) if buckets else None


class RoutersEvidence:
    """`await RoutersEvidence().read(query)`: the evidence over the window so far, or EvidenceError."""

    def __init__(
        self,
        timeout_s: float = 10.0,
        session_factory: Callable[[], aiohttp.ClientSession] | None = None,
        serve_url: Callable[[str, str], str] = lambda namespace, rayservice: (
            f"http://{rayservice}-serve-svc.{namespace}.svc:{SERVE_PORT}"
        ),
    ):
        self.timeout_s = timeout_s
        self.serve_url = serve_url
        """(namespace, RayService) → the base URL of its serve Service (KubeRay's `<name>-serve-svc`)."""
        self._session_factory = session_factory or (lambda: aiohttp.ClientSession(trust_env=False))
        self._baselines: OrderedDict[str, dict[tuple[str, str], _Totals]] = OrderedDict()

    async def read_canary(self, request: Request) -> Evidence:
        base = self.serve_url(request.namespace, request.rayservice)
        urls = {
            app: base + (prefix if prefix.startswith("/") else "/" + prefix) for app, prefix in request.routes.items()
        }
        return await self.read(
            RoutesQuery(urls, request.token, request.live_version, request.canary_version, request.window)
        )

    async def read(self, q: RoutesQuery) -> Evidence:
        answers = await asyncio.gather(*(self._get(app, url, q.token) for app, url in sorted(q.urls.items())))
        totals = _sum(answers)
        base = self._baselines.get(q.window)
        if base is None:
            self._baselines[q.window] = totals
            while len(self._baselines) > MAX_WINDOWS:
                self._baselines.popitem(last=False)
            base = totals
        window = {k: v.minus(base.get(k, _Totals())) for k, v in totals.items()}
        canary = window.get((q.canary_version, CLIENTS), _Totals())
        nodes = tuple(
            NodeCounts(app, node, Counts(canary.requests, failures))
            for app, node, failures in sorted(canary.failed)
            if failures
        )
        return Evidence(
            "routers",
            canary.to_counts(),
            window.get((q.live_version, CLIENTS), _Totals()).to_counts(),
            window.get((q.canary_version, MIRROR), _Totals()).to_counts(),
            nodes,
        )

    def forget(self, window_prefix: str) -> None:
        """Drop the baselines of windows that ended (a ServeGraph's canary over)."""
        for window in [w for w in self._baselines if w.startswith(window_prefix)]:
            del self._baselines[window]

    async def _get(self, app: str, url: str, token: str) -> tuple[str, Any]:
        try:
            async with (
                self._session_factory() as session,
                asyncio.timeout(self.timeout_s),
                session.get(url, headers={STATS_HEADER: token}) as resp,
            ):
                body = await resp.content.read(MAX_ANSWER + 1)
                if resp.status != 200:
                    raise EvidenceError(f"the routers of application {app!r} answered HTTP {resp.status}")
        except TimeoutError:
            raise EvidenceError(
                f"the routers of application {app!r} did not answer within {self.timeout_s:g}s"
            ) from None
        except aiohttp.ClientError as exc:
            raise EvidenceError(f"the routers of application {app!r} are unreachable: {type(exc).__name__}") from None
        if len(body) > MAX_ANSWER:
            raise EvidenceError(f"the routers of application {app!r} answered over {MAX_ANSWER} bytes")
        try:
            return app, json.loads(body)
        except ValueError:
            raise EvidenceError(f"the routers of application {app!r} answered something that is not JSON") from None


def _sum(answers: Sequence[tuple[str, Any]]) -> dict[tuple[str, str], _Totals]:
    """(version, caller kind) → totals over every application's answer."""
    out: dict[tuple[str, str], _Totals] = {}
    for app, doc in answers:
        versions = doc.get("versions") if isinstance(doc, Mapping) else None
        for version, kinds in (versions or {}).items():
            for kind, c in (kinds or {}).items():
                if not isinstance(c, Mapping):
                    continue
                lat = c.get("latency_ms") or {}
                mine = _Totals(
                    int(c.get("requests") or 0),
                    int(c.get("errors") or 0),
                    tuple((app, str(n), int(k)) for n, k in sorted((c.get("failed_nodes") or {}).items())),
                    tuple(float(b) for b in lat.get("buckets") or ()),
                    tuple(int(x) for x in lat.get("counts") or ()),
                )
                had = out.get((str(version), str(kind)))
                out[(str(version), str(kind))] = mine if had is None else _add(had, mine)
    return out


def _add(a: _Totals, b: _Totals) -> _Totals:
    counts = (
        tuple(x + y for x, y in zip(a.counts, b.counts, strict=True)) if len(a.counts) == len(b.counts) else a.counts
    )
    return _Totals(a.requests + b.requests, a.errors + b.errors, a.failed + b.failed, a.buckets or b.buckets, counts)
