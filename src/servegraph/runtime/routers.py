"""Declarative router nodes, each a Ray Serve deployment wired by the builder.

Routers talk to each other through `route(payload, headers)` so a header
`switch` works anywhere below the ingress; user deployments are called with
the payload alone (`handle.remote(payload)`), the way hand-written Serve code
calls them. Only a router at the ingress sees the HTTP request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from servegraph.runtime.payload import Headers, normalize_headers, payload_from_body, switch_value

logger = logging.getLogger("ray.serve")


@dataclass(frozen=True)
class Child:
    """A router's child: its node id, its handle, and whether it is a router too.

    `handle` is a bound Application while building; Serve swaps it for a
    DeploymentHandle before the router's constructor runs.
    """

    id: str
    handle: Any
    router: bool


async def call(child: Child, payload: Any, headers: Headers) -> Any:
    """Call one child: routers get the headers along, user code only the payload."""
    if child.router:
        return await child.handle.options(method_name="route").remote(payload, headers)
    return await child.handle.remote(payload)


class Router:
    """HTTP entry point shared by all routers: request in, JSON out."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id

    async def __call__(self, request: Any) -> Any:
        # A user deployment may call a router through a plain handle too.
        if not isinstance(request, Request):
            return await self.route(request, {})
        payload = payload_from_body(await request.body())
        result = await self.route(payload, normalize_headers(request.headers.items()))
        return json_response(self.node_id, result)

    async def route(self, payload: Any, headers: Headers) -> Any:
        raise NotImplementedError


def json_response(node_id: str, result: Any) -> Response:
    """Encode a router's result as the HTTP response body; 500 with a reason if it is not JSON."""
    if isinstance(result, Response):
        return result
    try:
        body = json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as e:
        logger.error("servegraph node %r: result is not JSON-serializable: %s", node_id, e)
        error = {"error": f"node {node_id!r}: result is not JSON-serializable: {e}"}
        return Response(json.dumps(error), status_code=500, media_type="application/json")
    return Response(body, media_type="application/json")


class SequenceRouter(Router):
    """Calls the steps in order; each step's output is the next step's input."""

    def __init__(self, node_id: str, steps: Sequence[Child]) -> None:
        super().__init__(node_id)
        self.steps = list(steps)

    async def route(self, payload: Any, headers: Headers) -> Any:
        for step in self.steps:
            payload = await call(step, payload, headers)
        return payload


class EnsembleRouter(Router):
    """Calls the members concurrently; returns {member id: output} or the combiner's output of it."""

    def __init__(self, node_id: str, members: Sequence[Child], combiner: Child | None = None) -> None:
        super().__init__(node_id)
        self.members = list(members)
        self.combiner = combiner

    async def route(self, payload: Any, headers: Headers) -> Any:
        outputs = await asyncio.gather(*(call(m, payload, headers) for m in self.members))
        results = {m.id: out for m, out in zip(self.members, outputs, strict=True)}
        if self.combiner is None:
            return results
        return await call(self.combiner, results, headers)


class SwitchRouter(Router):
    """Routes by a top-level JSON field or a header; unmatched requests go to the default."""

    def __init__(
        self,
        node_id: str,
        cases: Sequence[tuple[str, Child]],
        default: Child,
        field: str | None = None,
        header: str | None = None,
    ) -> None:
        super().__init__(node_id)
        self.cases: dict[str, Child] = {}
        for equals, child in cases:
            self.cases.setdefault(equals, child)  # the first matching case wins
        self.default = default
        self.field = field
        self.header = header

    def choose(self, payload: Any, headers: Headers) -> Child:
        value = switch_value(payload, headers, field=self.field, header=self.header)
        return self.default if value is None else self.cases.get(value, self.default)

    async def route(self, payload: Any, headers: Headers) -> Any:
        return await call(self.choose(payload, headers), payload, headers)


class SplitterRouter(Router):
    """Sends each request to one route at random, in proportion to the weights (canary, A/B)."""

    def __init__(self, node_id: str, routes: Sequence[tuple[Child, int]]) -> None:
        super().__init__(node_id)
        self.children = [child for child, _ in routes]
        self.weights = [weight for _, weight in routes]
        # Traffic splitting needs uniformity, not unpredictability.
        self._rng = random.Random()  # noqa: S311

    def choose(self) -> Child:
        return self._rng.choices(self.children, weights=self.weights)[0]

    async def route(self, payload: Any, headers: Headers) -> Any:
        return await call(self.choose(), payload, headers)
