"""A canary's evidence from Prometheus: the routers' per-version metrics over a window.

The administrator names the Prometheus (`servegraph run --prometheus-url`), as Flagger's
`metricsServer`; it scrapes the Ray pods through the shipped PodMonitor, which labels every
series with the pod's `namespace`. The routers label their edges with `graph`,
`graph_version` (the version that served the request), `caller` (`http`/`grpc` for clients,
`mirror` for copies) and `node` (runtime/telemetry.py). Each figure is one instant query
over the window so far (`increase` over it), answered within `timeout_s`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from servegraph.evidence.counts import Counts, Evidence, EvidenceError, NodeCounts, Request

REQUESTS = "ray_servegraph_requests_total"
ERRORS = "ray_servegraph_request_errors_total"
LATENCY = "ray_servegraph_request_latency_ms_bucket"
CLIENTS = "http|grpc"
MAX_ANSWER = 4 * 1024 * 1024
"""Bytes of one answer read at most (a per-node vector of a large graph is tens of KiB)."""


@dataclass(frozen=True)
class Query:
    """Whose evidence, over which window."""

    namespace: str
    graph: str
    live_version: str
    canary_version: str
    window_s: float
    applications: Mapping[str, str] = field(default_factory=dict)
    """Node id → application, to name a node's application (node ids are unique per application)."""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _selector(q: Query, version: str, caller: str) -> str:
    return (
        f'namespace="{_escape(q.namespace)}",graph="{_escape(q.graph)}",'
        f'graph_version="{_escape(version)}",caller=~"{caller}"'
    )


def queries(q: Query) -> dict[str, str]:
    """The PromQL of every figure (shown by `servegraph status`, tested for its shape)."""
    w = f"[{max(1, math.ceil(q.window_s))}s]"
    out: dict[str, str] = {}
    for name, version, caller in (
        ("canary", q.canary_version, CLIENTS),
        ("live", q.live_version, CLIENTS),
        ("mirrored", q.canary_version, "mirror"),
    ):
        # The client-facing edge is the ingress's: its caller is the proxy (http/grpc) or `mirror`.
        sel = _selector(q, version, caller)
        out[f"{name}.requests"] = f"sum(increase({REQUESTS}{{{sel}}}{w}))"
        out[f"{name}.errors"] = f"sum(increase({ERRORS}{{{sel}}}{w}))"
        out[f"{name}.p99"] = f"histogram_quantile(0.99, sum by (le) (increase({LATENCY}{{{sel}}}{w})))"
    for name, version in (("canary", q.canary_version), ("live", q.live_version)):
        sel = _selector(q, version, ".+")
        out[f"nodes.{name}.requests"] = f"sum by (node) (increase({REQUESTS}{{{sel}}}{w}))"
        out[f"nodes.{name}.errors"] = f"sum by (node) (increase({ERRORS}{{{sel}}}{w}))"
        out[f"nodes.{name}.p99"] = f"histogram_quantile(0.99, sum by (le, node) (increase({LATENCY}{{{sel}}}{w})))"
    return out


class PrometheusEvidence:
    """`await PrometheusEvidence(url).read(query)`: an Evidence, or EvidenceError."""

    def __init__(self, url: str, timeout_s: float = 10.0, session: aiohttp.ClientSession | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._session = session

    async def read_canary(self, request: Request) -> Evidence:
        return await self.read(
            Query(
                request.namespace,
                request.graph,
                request.live_version,
                request.canary_version,
                request.window_s,
                request.applications,
            )
        )

    async def read(self, q: Query) -> Evidence:
        texts = queries(q)
        answers = await asyncio.gather(*(self._query(promql) for promql in texts.values()))
        got = dict(zip(texts, answers, strict=True))

        def scalar(name: str) -> float | None:
            vector = got[name]
            return vector.get("", None)

        def counts(prefix: str) -> Counts:
            return Counts(
                round(scalar(f"{prefix}.requests") or 0),
                round(scalar(f"{prefix}.errors") or 0),
                scalar(f"{prefix}.p99"),
            )

        nodes = []
        requests = got["nodes.canary.requests"]
        for node in sorted(requests):
            if not node:
                continue
            canary = Counts(
                round(requests[node]),
                round(got["nodes.canary.errors"].get(node, 0)),
                got["nodes.canary.p99"].get(node),
            )
            nodes.append(NodeCounts(q.applications.get(node, ""), node, canary, got["nodes.live.p99"].get(node)))
        return Evidence("prometheus", counts("canary"), counts("live"), counts("mirrored"), tuple(nodes))

    async def _query(self, promql: str) -> dict[str, float]:
        """label `node` (or "" for a scalar sum) → value; NaN (no data) left out."""
        session = self._session or aiohttp.ClientSession(trust_env=False)
        try:
            async with asyncio.timeout(self.timeout_s):
                async with session.get(f"{self.url}/api/v1/query", params={"query": promql}) as resp:
                    body = await resp.content.read(MAX_ANSWER + 1)
                    if resp.status != 200:
                        raise EvidenceError(f"Prometheus at {self.url} answered HTTP {resp.status}")
        except TimeoutError:
            raise EvidenceError(f"Prometheus at {self.url} did not answer within {self.timeout_s:g}s") from None
        except aiohttp.ClientError as exc:
            raise EvidenceError(f"Prometheus at {self.url} is unreachable: {type(exc).__name__}") from None
        finally:
            if self._session is None:
                await session.close()
        if len(body) > MAX_ANSWER:
            raise EvidenceError(f"Prometheus at {self.url} answered over {MAX_ANSWER} bytes")
        return parse_vector(body, self.url)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def parse_vector(body: bytes, where: str) -> dict[str, float]:
    """An instant query's answer (`resultType: vector`) as node → value."""
    import json

    try:
        doc: Any = json.loads(body)
        result = doc["data"]["result"]
        out: dict[str, float] = {}
        for sample in result:
            value = float(sample["value"][1])
            if not math.isnan(value):
                out[str(sample.get("metric", {}).get("node", ""))] = value
        return out
    except (ValueError, KeyError, TypeError, IndexError):
        raise EvidenceError(f"Prometheus at {where} answered something that is not an instant vector") from None
