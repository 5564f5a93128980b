"""A switch's or a splitter's choice, made by whichever router holds it.

Which child a switch or a splitter sends a request to is a pure function of the
payload, the headers and (for a splitter) its `Spread`. So a router whose child is a switch
or a splitter makes that choice itself and calls the chosen grandchild directly
(`Child.choice`): the request skips one replica hop, and a stream is no longer relayed
item by item through the switch's replica — measured, that relay cost 0.65 ms of CPU
per item and a third of a sequence + switch stream's throughput (BENCHMARKS.md). Both
edges keep their options and their metrics: the parent → switch edge's timeout and
retries bound the whole choice, the switch → grandchild edge's bound the call it makes,
each recorded under its own names. The switch's own deployment still answers when it is
the ingress or is called by user code.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from servegraph.runtime.payload import Headers, switch_value

if TYPE_CHECKING:
    from servegraph.runtime.calls import Child

# Seeded in each process that imports this (each replica), never shipped in the args: two
# replicas must not start their `Spread` at the same point. Traffic splitting needs
# uniformity, not unpredictability.
_RNG = random.Random()  # noqa: S311


@dataclass(frozen=True)
class SwitchChoice:
    """By a top-level JSON field or a header; unmatched requests go to the default."""

    cases: Mapping[str, Child]
    default: Child
    field: str | None = None
    header: str | None = None

    @classmethod
    def of(
        cls, cases: Sequence[tuple[str, Child]], default: Child, field: str | None, header: str | None
    ) -> SwitchChoice:
        first: dict[str, Child] = {}
        for equals, child in cases:
            first.setdefault(equals, child)  # the first matching case wins
        return cls(first, default, field, header)

    def pick(self, payload: Any, headers: Headers) -> Child:
        value = switch_value(payload, headers, field=self.field, header=self.header)
        return self.default if value is None else self.cases.get(value, self.default)

    def children(self) -> list[Child]:
        return [*self.cases.values(), self.default]


class Spread:
    """Points in [0, 100) that cover it evenly: the golden-ratio Weyl sequence from a random start.

    A split by random draws strays from its weight by ~sqrt(n)/2 requests (at 50 %, +/-5
    points over 100 requests one time in three) and gives one route runs of requests, so its
    replicas queue while the other's idle. Over any stretch of n points this one's share below
    a weight is within ~log(n) requests of it (3.6 at most over 5,000, every weight 1-99), and
    at 50 % a route never gets more than two in a row. The random start keeps the
    replicas apart. Every stride of the sequence is itself such a sequence, so a client whose
    requests alternate in a period still gets each route at its weight."""

    STEP = 100.0 * (math.sqrt(5.0) - 1.0) / 2.0

    def __init__(self, start: float) -> None:
        self._point = start % 100.0

    def __call__(self) -> float:
        self._point = (self._point + self.STEP) % 100.0
        return self._point


@dataclass(frozen=True)
class SplitChoice:
    """One route per request, in proportion to the weights over any stretch of requests (A/B):
    the next `Spread` point, scaled to the weights' sum, falls in one route's share."""

    routes: tuple[Child, ...]
    weights: tuple[int, ...]
    spread: Spread = field(default_factory=lambda: Spread(_RNG.random() * 100.0), compare=False)

    def pick(self, payload: Any, headers: Headers) -> Child:
        point = self.spread() * sum(self.weights) / 100.0
        for route, edge in zip(self.routes, itertools.accumulate(self.weights), strict=True):
            if point < edge:
                return route
        return next(r for r, w in zip(self.routes, self.weights, strict=True) if w > 0)

    def children(self) -> list[Child]:
        return list(self.routes)


Choice = SwitchChoice | SplitChoice
