"""A canary in `servegraph status`: where it is, and the evidence of its last check (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from servegraph.statustree.age import age

RUNS = ("Deploying", "Mirroring", "Weighted")


def canary_lines(rollout: Mapping[str, Any] | None, now: datetime) -> list[str]:
    """`Canary:` and the last check's evidence, version by version and node by node."""
    state = (rollout or {}).get("canary") or {}
    phase = state.get("phase")
    if not phase:
        return []
    beside = f"beside {state.get('liveVersion')!r}" if state.get("liveVersion") else ""
    if phase == "Weighted":
        where = f"step {state.get('step')} of {state.get('steps')}: {state.get('weight')} % of requests {beside}"
    elif phase == "Mirroring":
        where = f"copies of {state.get('mirror')} % of live requests {beside}"
    elif phase == "Deploying":
        where = f"its changed deployments starting {beside}"
    else:
        tried = f"version {state['version']!r}: " if state.get("version") else ""
        where = f"{tried}{state.get('message') or ''}"
    since = f" (since {age(state.get('stepStartedAt'), now)})" if phase in RUNS and state.get("stepStartedAt") else ""
    lines = [f"Canary:        {phase}: {where.strip()}{since}"]
    evidence = state.get("evidence") or {}
    if evidence.get("verdict"):
        lines.append(
            f"  last check {evidence['verdict']} {age(evidence.get('at'), now)} ago ({evidence.get('source')}): "
            f"{evidence.get('reason', '')}"
        )
        for name in ("canary", "live", "mirrored"):
            if evidence.get(name):
                lines.append(f"    {name + ':':<10}{_counts(evidence[name])}")
        for node in evidence.get("nodes") or ():
            live = f" (live p99 {node['liveP99Ms']:.0f} ms)" if node.get("liveP99Ms") is not None else ""
            lines.append(f"    node {node.get('application')}/{node.get('node')}: {_counts(node)}{live}")
    if phase in RUNS and state.get("message"):
        lines.append(f"  {state['message']}")
    return lines


def _counts(c: Mapping[str, Any]) -> str:
    p99 = f", p99 {c['p99Ms']:.0f} ms" if c.get("p99Ms") is not None else ""
    rate = c.get("errorRate") or 0
    return f"{c.get('requests', 0):,} requests, {c.get('errors', 0):,} failed ({rate * 100:.3g} %){p99}"
