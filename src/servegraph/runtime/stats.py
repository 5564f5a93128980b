"""A canary's evidence without Prometheus: the ingress routers' own per-version aggregates.

Every ingress replica counts, per version and per kind of caller (`clients`: HTTP and gRPC;
`mirror`: the copies), the requests, the failures (and which node failed), and a latency
histogram with the buckets of the routers' Prometheus histogram. It pushes its totals (not
increments: a push lost or repeated changes nothing) to one named Ray actor per
application, which sums the replicas' latest totals. An HTTP request to the application's
route with `STATS_HEADER` set to the token in the ingress router's `user_config` is answered
with that sum as JSON (`answer`), so the operator reads it through the serve Service as
any client would. The actor belongs to the replica that made it: when that replica goes,
another one makes it again at its next push, and the totals of the live replicas are back
within a push (`PUSH_INTERVAL_S`); only a gone replica's counts are lost, which a reader
sees as a counter going down (a reset, as Prometheus' readers treat one).
"""

from __future__ import annotations

import asyncio
import bisect
import hmac
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from servegraph.runtime.telemetry import LATENCY_BUCKETS_MS

if TYPE_CHECKING:
    from servegraph.runtime.routing import Routing

logger = logging.getLogger("ray.serve")

CLIENTS = "clients"
MIRROR = "mirror"
MAX_VERSIONS = 8
"""Versions one replica keeps totals of; the oldest seen goes first."""
MAX_NODES = 256
"""Failing nodes named per version at most (the rest counted under `other`)."""
MAX_REPLICAS = 1024
PUSH_INTERVAL_S = 1.0
ACTOR_NAMESPACE = "servegraph"


def _empty() -> dict[str, Any]:
    return {
        "requests": 0,
        "errors": 0,
        "failed_nodes": {},
        "latency_ms": {"buckets": list(LATENCY_BUCKETS_MS), "counts": [0] * (len(LATENCY_BUCKETS_MS) + 1), "sum": 0.0},
    }


class RouteStats:
    """One replica's totals: version → `clients` | `mirror` → requests, errors, failed nodes, latency."""

    def __init__(self) -> None:
        self.versions: dict[str, dict[str, dict[str, Any]]] = {}
        self.changed = False

    def record(self, version: str, kind: str, seconds: float, failed_node: str | None = None) -> None:
        per = self.versions.get(version)
        if per is None:
            if len(self.versions) >= MAX_VERSIONS:
                del self.versions[next(iter(self.versions))]
            per = self.versions[version] = {}
        agg = per.get(kind)
        if agg is None:
            agg = per[kind] = _empty()
        ms = seconds * 1000.0
        agg["requests"] += 1
        latency = agg["latency_ms"]
        latency["counts"][bisect.bisect_left(LATENCY_BUCKETS_MS, ms)] += 1
        latency["sum"] += ms
        if failed_node is not None:
            agg["errors"] += 1
            nodes = agg["failed_nodes"]
            name = failed_node if failed_node in nodes or len(nodes) < MAX_NODES else "other"
            nodes[name] = nodes.get(name, 0) + 1
        self.changed = True

    def snapshot(self) -> dict[str, Any]:
        return {
            v: {
                k: {**a, "failed_nodes": dict(a["failed_nodes"]), "latency_ms": _copy_latency(a["latency_ms"])}
                for k, a in per.items()
            }
            for v, per in self.versions.items()
        }


def _copy_latency(latency: Mapping[str, Any]) -> dict[str, Any]:
    return {"buckets": list(latency["buckets"]), "counts": list(latency["counts"]), "sum": latency["sum"]}


def merged(snapshots: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The sum of replicas' snapshots."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for snapshot in snapshots:
        for version, per in snapshot.items():
            for kind, agg in per.items():
                total = out.setdefault(version, {}).setdefault(kind, _empty())
                total["requests"] += agg["requests"]
                total["errors"] += agg["errors"]
                for node, n in agg["failed_nodes"].items():
                    total["failed_nodes"][node] = total["failed_nodes"].get(node, 0) + n
                counts = total["latency_ms"]["counts"]
                for i, n in enumerate(agg["latency_ms"]["counts"][: len(counts)]):
                    counts[i] += n
                total["latency_ms"]["sum"] += agg["latency_ms"]["sum"]
    return out


class StatsStore:
    """The per-application sum (a Ray actor's body): each replica's latest totals."""

    def __init__(self) -> None:
        self.replicas: dict[str, dict[str, Any]] = {}

    def push(self, replica: str, snapshot: dict[str, Any]) -> int:
        if replica not in self.replicas and len(self.replicas) >= MAX_REPLICAS:
            del self.replicas[next(iter(self.replicas))]
        self.replicas[replica] = snapshot
        return len(self.replicas)

    def read(self) -> dict[str, Any]:
        return {"replicas": len(self.replicas), "versions": merged(self.replicas.values())}


class StatsLink:
    """An ingress replica's link to its application's StatsStore actor (made on first use)."""

    def __init__(self, replica: str) -> None:
        self.replica = replica
        self.stats = RouteStats()
        self._actor: Any = None
        self._loop: asyncio.Future[None] | None = None

    def _store(self) -> Any:
        if self._actor is None:
            import ray
            from ray import serve

            app = serve.get_replica_context().app_name
            remote: Any = ray.remote(num_cpus=0)(StatsStore)
            self._actor = remote.options(
                name=f"servegraph-stats:{app}", namespace=ACTOR_NAMESPACE, get_if_exists=True
            ).remote()
        return self._actor

    def started(self) -> None:
        """Push in the background from now on (called from a request: the replica's loop)."""
        if self._loop is None or self._loop.done():
            self._loop = asyncio.ensure_future(self._pushing())

    async def _pushing(self) -> None:
        while True:
            await asyncio.sleep(PUSH_INTERVAL_S)
            if self.stats.changed:
                try:
                    await self.push()
                except Exception as e:  # the actor went with its replica: made again next time
                    logger.info("servegraph stats push failed (%s); retrying", type(e).__name__)
                    self._actor = None

    async def push(self) -> None:
        self.stats.changed = False
        await self._store().push.remote(self.replica, self.stats.snapshot())

    async def read(self) -> dict[str, Any]:
        """Every replica's totals summed, this one's as of now."""
        try:
            await self.push()
            return dict(await self._store().read.remote())
        except Exception:
            self._actor = None
            await self.push()
            return dict(await self._store().read.remote())


async def stats_answer(link: StatsLink | None, routing: Routing, given: str) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) for a request carrying `STATS_HEADER`: the sum as JSON for the
    token, 403 for another, 404 where the ingress keeps no stats (no canary runs)."""
    settings = routing.settings
    token = settings.stats
    if link is None or token is None:
        return 404, {"error": "no canary stats here"}
    if not hmac.compare_digest(given.encode(), token.encode()):
        return 403, {"error": "wrong stats token"}
    body = await link.read()
    live = settings.live.version if settings.live is not None else routing.default_version
    canary = settings.canary.version if settings.canary is not None else None
    return 200, {"graph": settings.graph_name, "live": live, "canary": canary, **body}
