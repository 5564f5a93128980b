"""Declarative router nodes, each a Ray Serve deployment wired by the builder.

Routers talk to each other through `route(payload, headers)` so a header
`switch` works anywhere below the ingress; user deployments are called with
the payload alone (`handle.remote(payload)`), the way hand-written Serve code
calls them, plus `headers=` (the trace context and the application's forwarded
headers) when their `__call__` declares it. Only a router at the ingress sees
the HTTP request. Every call a router makes goes through `Router.call`, which
applies the edge's timeout and retries (`calls.py`) and records the edge's
metrics and span (`telemetry.py`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from servegraph.dag.args import graph_identity
from servegraph.runtime.calls import Child, NodeTimeout, invoke, timeout_of
from servegraph.runtime.payload import Headers, normalize_headers, payload_from_body, switch_value
from servegraph.runtime.telemetry import HTTP_CALLER, EdgeMetrics, GraphContext, Spans, forwarded

__all__ = [
    "Child",
    "EnsembleRouter",
    "GraphContext",
    "NodeTimeout",
    "Router",
    "SequenceRouter",
    "SplitterRouter",
    "SwitchRouter",
    "json_response",
]

logger = logging.getLogger("ray.serve")


class Router:
    """HTTP entry point shared by all routers: request in, JSON out; and the one way to call a child."""

    def __init__(self, node_id: str, context: GraphContext | None = None) -> None:
        self.node_id = node_id
        self.context = context or GraphContext()
        telemetry = self.context.telemetry
        self.forward_names = telemetry.forward_headers
        self.metrics = EdgeMetrics(self.context) if telemetry.metrics else None
        self.spans = Spans(self.context.graph)

    def reconfigure(self, config: Mapping[str, Any]) -> None:
        """Serve calls this with the router's `user_config` when a replica starts and on
        every change to it: the graph's name and version arrive here rather than in the
        application's args, so a publish that changes only the version restarts nothing."""
        name, version = graph_identity(config)
        self.context = replace(
            self.context,
            graph=self.context.graph if name is None else name,
            version=self.context.version if version is None else version,
        )
        if self.metrics is not None:
            self.metrics.label(self.context)
        self.spans.graph = self.context.graph

    async def __call__(self, request: Any) -> Any:
        # A user deployment may call a router through a plain handle too.
        if not isinstance(request, Request):
            return await self.route(request, {})
        payload = payload_from_body(await request.body())
        headers = normalize_headers(request.headers.items())
        start = time.perf_counter()
        try:
            with self.spans.hop(HTTP_CALLER, self.node_id, headers, server=True) as headers:
                result = await self.route(payload, headers)
        except Exception as e:
            timed_out = timeout_of(e)
            self._record_failure(HTTP_CALLER, self.node_id, timed_out)
            if timed_out is None:
                raise
            logger.warning("servegraph node %r: %s", self.node_id, timed_out)
            return json_response(self.node_id, timed_out.body(), status=504)
        finally:
            if self.metrics is not None:
                self.metrics.call(HTTP_CALLER, self.node_id, time.perf_counter() - start)
        return json_response(self.node_id, result)

    async def route(self, payload: Any, headers: Headers) -> Any:
        raise NotImplementedError

    async def call(self, child: Child, payload: Any, headers: Headers) -> Any:
        """Call one child over its edge: timeout, retries, metrics, span, forwarded headers."""
        start = time.perf_counter()
        try:
            with self.spans.hop(self.node_id, child.id, headers) as sent:
                user_headers = forwarded(sent, self.forward_names) if child.takes_headers else sent
                return await invoke(child, payload, sent, user_headers, self._retried)
        except Exception as e:
            self._record_failure(self.node_id, child.id, timeout_of(e))
            raise
        finally:
            if self.metrics is not None:
                self.metrics.call(self.node_id, child.id, time.perf_counter() - start)

    def _retried(self, node: str, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.retried(self.node_id, node, reason)

    def _record_failure(self, caller: str, node: str, timed_out: NodeTimeout | None) -> None:
        if self.metrics is not None:
            self.metrics.failed(caller, node, "error" if timed_out is None else "timeout")


def json_response(node_id: str, result: Any, status: int = 200) -> Response:
    """Encode a router's result as the HTTP response body; 500 with a reason if it is not JSON."""
    if isinstance(result, Response):
        return result
    try:
        body = json.dumps(result, allow_nan=False)
    except (TypeError, ValueError) as e:
        logger.error("servegraph node %r: result is not JSON-serializable: %s", node_id, e)
        error = {"error": f"node {node_id!r}: result is not JSON-serializable: {e}"}
        return Response(json.dumps(error), status_code=500, media_type="application/json")
    return Response(body, status_code=status, media_type="application/json")


class SequenceRouter(Router):
    """Calls the steps in order; each step's output is the next step's input."""

    def __init__(self, node_id: str, steps: Sequence[Child], context: GraphContext | None = None) -> None:
        super().__init__(node_id, context)
        self.steps = list(steps)

    async def route(self, payload: Any, headers: Headers) -> Any:
        for step in self.steps:
            payload = await self.call(step, payload, headers)
        return payload


class EnsembleRouter(Router):
    """Calls the members concurrently; returns {member id: output} or the combiner's output of it.

    A required member that fails (after its retries) fails the ensemble at once and
    the other members' calls are cancelled; an optional one gets, in place of its
    output, what went wrong: `{"error": ..., "node": ..., "timed_out": ...}`.
    """

    def __init__(
        self,
        node_id: str,
        members: Sequence[Child],
        combiner: Child | None = None,
        context: GraphContext | None = None,
    ) -> None:
        super().__init__(node_id, context)
        self.members = list(members)
        self.combiner = combiner

    async def route(self, payload: Any, headers: Headers) -> Any:
        tasks = [asyncio.ensure_future(self._member(m, payload, headers)) for m in self.members]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            failed = next((t for t in tasks if t in done and t.exception() is not None), None)
            if failed is not None:
                raise failed.exception()  # type: ignore[misc]
        finally:
            for task in tasks:
                task.cancel()
        results = {m.id: t.result() for m, t in zip(self.members, tasks, strict=True)}
        if self.combiner is None:
            return results
        return await self.call(self.combiner, results, headers)

    async def _member(self, member: Child, payload: Any, headers: Headers) -> Any:
        if not member.call.optional:
            return await self.call(member, payload, headers)
        try:
            return await self.call(member, payload, headers)
        except Exception as e:
            timed_out = timeout_of(e)
            if timed_out is not None:
                return timed_out.body()
            cause = getattr(e, "cause", None) or e
            return {"error": f'node "{member.id}" failed: {type(cause).__name__}: {cause}', "node": member.id}


class SwitchRouter(Router):
    """Routes by a top-level JSON field or a header; unmatched requests go to the default."""

    def __init__(
        self,
        node_id: str,
        cases: Sequence[tuple[str, Child]],
        default: Child,
        field: str | None = None,
        header: str | None = None,
        context: GraphContext | None = None,
    ) -> None:
        super().__init__(node_id, context)
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
        return await self.call(self.choose(payload, headers), payload, headers)


class SplitterRouter(Router):
    """Sends each request to one route at random, in proportion to the weights (canary, A/B)."""

    def __init__(self, node_id: str, routes: Sequence[tuple[Child, int]], context: GraphContext | None = None) -> None:
        super().__init__(node_id, context)
        self.children = [child for child, _ in routes]
        self.weights = [weight for _, weight in routes]
        # Traffic splitting needs uniformity, not unpredictability.
        self._rng = random.Random()  # noqa: S311

    def choose(self) -> Child:
        return self._rng.choices(self.children, weights=self.weights)[0]

    async def route(self, payload: Any, headers: Headers) -> Any:
        return await self.call(self.choose(), payload, headers)
