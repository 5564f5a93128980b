"""A canary's evidence judged against `spec.rollout.canary.analysis` (pure).

The evidence is what the routers recorded per version over the step so far (read from
Prometheus, or from the routers' own counters without one: src/servegraph/evidence/): the
new version's requests, failures and p99 at the ingress — its mirrored copies' while
mirroring — beside the live version's, and the same per node. A verdict names the
threshold, the node and the figure, so a Warning Event and the status say exactly why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from servegraph.evidence import Counts, Evidence
from servegraph.operator.spec import Analysis

Verdict = Literal["Pass", "Fail", "Waiting"]

P99_REQUESTS = 100
"""Requests a p99 is judged on. Over fewer, the 99th percentile is the slowest request: one
cold replica's first call (a handle's first lookup, a worker's import) would abort a good
version, and the new version's few requests would be held to a stricter figure than the
live version's many."""


@dataclass(frozen=True)
class Judged:
    verdict: Verdict
    reason: str


def judge(evidence: Evidence, analysis: Analysis, mirroring: bool) -> Judged:
    """Pass, Fail (naming the threshold, node and figure) or Waiting (too few requests yet).

    Errors are judged from `min_requests` on; latency from P99_REQUESTS on, the new version's
    overall p99 waited for (the step holds), a node's skipped while it has fewer (as a node
    with no requests is: a rarely taken branch must not hold every step).
    """
    own = evidence.mirrored if mirroring else evidence.canary
    what = "mirrored requests" if mirroring else "requests"
    if own.requests < analysis.min_requests:
        return Judged("Waiting", f"{own.requests} of the {analysis.min_requests} {what} a verdict needs")
    for threshold in analysis.nodes:
        found = next(
            (n for n in evidence.nodes if (n.application, n.node) == (threshold.application, threshold.node)), None
        )
        if found is None or not found.canary.requests:
            continue
        where = f'application "{found.application}", node "{found.node}"'
        if threshold.max_error_rate is not None and found.canary.error_rate > threshold.max_error_rate:
            return Judged("Fail", f"{where}: {_rate(found.canary)} over its {_pct(threshold.max_error_rate)}")
        slow = _slower(found.canary, found.live_p99_ms, threshold.max_latency_ratio)
        if slow:
            return Judged("Fail", f"{where}: {slow}")
    if own.error_rate > analysis.max_error_rate:
        return Judged("Fail", f"{_rate(own)} over the {_pct(analysis.max_error_rate)} allowed{_worst(evidence)}")
    if own.requests < P99_REQUESTS:
        return Judged("Waiting", f"{_rate(own)}; its p99 is judged from {P99_REQUESTS} {what}, {own.requests} so far")
    slow = _slower(own, evidence.live.p99_ms, analysis.max_latency_ratio)
    if slow:
        return Judged("Fail", slow + _slowest(evidence))
    return Judged("Pass", f"{_rate(own)}" + (f", p99 {own.p99_ms:.0f} ms" if own.p99_ms is not None else ""))


def _rate(c: Counts) -> str:
    return f"error rate {_pct(c.error_rate)} ({c.errors} of {c.requests} requests)"


def _pct(rate: float) -> str:
    return f"{rate * 100:.3g} %"


def _slower(c: Counts, live: float | None, ratio: float | None) -> str:
    """Why `c` is too slow; "" when it is not, or has too few requests for a p99 to say."""
    p99 = c.p99_ms
    if ratio is None or p99 is None or not live or c.requests < P99_REQUESTS or p99 <= ratio * live:
        return ""
    return (
        f"p99 {p99:.0f} ms over {c.requests} requests, {p99 / live:.2g}x the live version's {live:.0f} ms"
        f" (at most {ratio:g}x)"
    )


def _worst(evidence: Evidence) -> str:
    """Where most of the new version's failures were, when the routers recorded it."""
    failing = [n for n in evidence.nodes if n.canary.errors]
    if not failing:
        return ""
    worst = max(failing, key=lambda n: (n.canary.errors, n.application, n.node))
    return f'; most at application "{worst.application}", node "{worst.node}" ({_rate(worst.canary)})'


def _slowest(evidence: Evidence) -> str:
    ratios = [
        (n.canary.p99_ms / n.live_p99_ms, n) for n in evidence.nodes if n.canary.p99_ms is not None and n.live_p99_ms
    ]
    if not ratios:
        return ""
    ratio, n = max(ratios, key=lambda r: (r[0], r[1].application, r[1].node))
    assert n.canary.p99_ms is not None and n.live_p99_ms is not None
    return (
        f'; slowest at application "{n.application}", node "{n.node}" '
        f"(p99 {n.canary.p99_ms:.0f} ms against {n.live_p99_ms:.0f} ms, {ratio:.2g}x)"
    )


def evidence_status(evidence: Evidence, judged: Judged, at: str) -> dict[str, Any]:
    """`status.rollout.canary.evidence`: the failing or slowest nodes first, at most 20."""
    nodes = sorted(
        evidence.nodes,
        key=lambda n: (-n.canary.errors, -((n.canary.p99_ms or 0) / (n.live_p99_ms or 1)), n.application, n.node),
    )[:20]
    out: dict[str, Any] = {
        "at": at,
        "source": evidence.source,
        "verdict": judged.verdict,
        "reason": judged.reason[:1024],
        "canary": evidence.canary.status(),
        "live": evidence.live.status(),
    }
    if evidence.mirrored.requests:
        out["mirrored"] = evidence.mirrored.status()
    if nodes:
        out["nodes"] = [
            {"application": n.application, "node": n.node, **n.canary.status()}
            | ({"liveP99Ms": round(n.live_p99_ms, 1)} if n.live_p99_ms is not None else {})
            for n in nodes
        ]
    return out
