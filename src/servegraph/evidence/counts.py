"""What a canary's versions did over a window: requests, failures, p99, overall and per node."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


class EvidenceError(Exception):
    """The evidence could not be read; the message says from where and why (no verdict is made)."""


@dataclass(frozen=True)
class Counts:
    """One version's (or one node's) requests over the window."""

    requests: int = 0
    errors: int = 0
    p99_ms: float | None = None

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"requests": self.requests, "errors": self.errors, "errorRate": round(self.error_rate, 4)}
        if self.p99_ms is not None:
            out["p99Ms"] = round(self.p99_ms, 1)
        return out


@dataclass(frozen=True)
class NodeCounts:
    application: str
    node: str
    canary: Counts
    live_p99_ms: float | None = None


@dataclass(frozen=True)
class Evidence:
    source: str
    """Where it was read: `prometheus` or `routers` (the routers' own counters)."""
    canary: Counts
    """The new version's client requests at the ingress."""
    live: Counts
    mirrored: Counts = Counts()
    """Copies of live requests the new version answered (no client saw them)."""
    nodes: tuple[NodeCounts, ...] = ()


@dataclass(frozen=True)
class Request:
    """Whose canary evidence, over which window: what either reader needs."""

    namespace: str
    rayservice: str
    graph: str
    live_version: str
    canary_version: str
    window: str
    """An id of the window (the canary's step): the routers' reader keeps its baseline by it."""
    window_s: float
    applications: Mapping[str, str] = field(default_factory=dict)
    """Node id → its application, in the canary's graph."""
    routes: Mapping[str, str] = field(default_factory=dict)
    """Application → its route prefix."""
    token: str = field(default="", repr=False)
    """The routers' stats token (rendered into the ingress routers' user_config)."""


class Reader(Protocol):
    """Reads a canary's evidence; raises EvidenceError (no verdict is made without it)."""

    async def read_canary(self, request: Request) -> Evidence: ...
