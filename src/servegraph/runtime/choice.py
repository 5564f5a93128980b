"""A switch's or a splitter's choice, made by whichever router holds it.

Which child a switch or a splitter sends a request to is a pure function of the
payload, the headers and (for a splitter) a coin. So a router whose child is a switch
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

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from servegraph.runtime.payload import Headers, switch_value

if TYPE_CHECKING:
    from servegraph.runtime.calls import Child


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


@dataclass(frozen=True)
class SplitChoice:
    """One route at random, in proportion to the weights (canary, A/B)."""

    routes: tuple[Child, ...]
    weights: tuple[int, ...]

    def pick(self, payload: Any, headers: Headers) -> Child:
        return _RNG.choices(self.routes, weights=self.weights)[0]

    def children(self) -> list[Child]:
        return list(self.routes)


Choice = SwitchChoice | SplitChoice

# Seeded in each process that imports this (each replica), never shipped in the args: two
# replicas must not draw the same sequence. Traffic splitting needs uniformity, not
# unpredictability.
_RNG = random.Random()  # noqa: S311
