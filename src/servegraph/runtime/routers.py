"""Declarative router nodes, each a Ray Serve deployment wired by the builder.

Routers talk to each other through `route(payload, headers)` so a header
`switch` works anywhere below the ingress; user deployments are called with
the payload alone (`handle.remote(payload)`), the way hand-written Serve code
calls them, plus `headers=` (the trace context and the application's forwarded
headers) when their `__call__` declares it. Only a router at the ingress sees
the HTTP request. Every call a router makes goes through `Router.call` (or
`Router.call_stream` for a streaming child), which applies the edge's timeout and
retries (`calls.py`) and records the edge's metrics and span (`telemetry.py`).

A router whose output streams (`dag.streams`) answers `stream(payload, headers)`, an
async generator, to routers above it; at the ingress it answers HTTP with a chunked
body (`wire.py`) and gRPC's `Stream` item by item. Every router answers
`servegraph.v1.GraphService` (`Call`, `Stream`) at the ingress.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Any

from servegraph.runtime.calls import Child, NodeTimeout, logged, timeout_of
from servegraph.runtime.choice import SplitChoice, SwitchChoice
from servegraph.runtime.payload import Headers
from servegraph.runtime.router import Router, json_response
from servegraph.runtime.telemetry import GraphContext

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


class SequenceRouter(Router):
    """Calls the steps in order; each step's output is the next step's input."""

    def __init__(
        self, node_id: str, steps: Sequence[Child], context: GraphContext | None = None, streams: bool = False
    ) -> None:
        super().__init__(node_id, context, streams)
        self.steps = list(steps)

    async def route(self, payload: Any, headers: Headers) -> Any:
        for step in self.steps:
            payload = await self.call(step, payload, headers)
        return payload

    async def items(self, payload: Any, headers: Headers) -> AsyncGenerator[Any, None]:
        """Unary steps up to the first streaming one, which starts the stream; every later
        step transforms it item by item (a streaming transform yields zero or more items)."""
        first = next(i for i, s in enumerate(self.steps) if s.streams)
        for step in self.steps[:first]:
            payload = await self.call(step, payload, headers)
        items = self.call_stream(self.steps[first], payload, headers)
        for step in self.steps[first + 1 :]:
            items = self._transform(step, items, headers)
        async with aclosing(items):
            async for item in items:
                yield item

    async def _transform(
        self, step: Child, items: AsyncGenerator[Any, None], headers: Headers
    ) -> AsyncGenerator[Any, None]:
        async with aclosing(items):
            async for item in items:
                if not step.streams:
                    yield await self.call(step, item, headers)
                    continue
                async with aclosing(self.call_stream(step, item, headers)) as outs:
                    async for out in outs:
                        yield out


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
        streams: bool = False,
    ) -> None:
        super().__init__(node_id, context, streams)
        self.members = list(members)
        self.combiner = combiner

    async def route(self, payload: Any, headers: Headers) -> Any:
        results = await self._all_members(payload, headers)
        if self.combiner is None:
            return results
        return await self.call(self.combiner, results, headers)

    async def items(self, payload: Any, headers: Headers) -> AsyncGenerator[Any, None]:
        """A streaming combiner's items, given every member's whole answer."""
        assert self.combiner is not None
        results = await self._all_members(payload, headers)
        async with aclosing(self.call_stream(self.combiner, results, headers)) as items:
            async for item in items:
                yield item

    async def _all_members(self, payload: Any, headers: Headers) -> dict[str, Any]:
        tasks = [asyncio.ensure_future(self._member(m, payload, headers)) for m in self.members]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            failed = next((t for t in tasks if t in done and t.exception() is not None), None)
            if failed is not None:
                raise failed.exception()  # type: ignore[misc]
        finally:
            for task in tasks:
                task.cancel()
        return {m.id: t.result() for m, t in zip(self.members, tasks, strict=True)}

    async def _member(self, member: Child, payload: Any, headers: Headers) -> Any:
        if not member.call.optional:
            return await self.call(member, payload, headers)
        try:
            return await self.call(member, payload, headers)
        except Exception as e:
            timed_out = timeout_of(e)
            if timed_out is not None:
                return timed_out.body()
            return {"error": f'node "{member.id}" failed: {logged(e, member.id)}', "node": member.id}


class SwitchRouter(Router):
    """Routes by a top-level JSON field or a header; unmatched requests go to the default.

    Called by another router, its choice is made there (`choice.py`): this deployment
    answers when it is the ingress, or when user code calls it."""

    def __init__(
        self,
        node_id: str,
        cases: Sequence[tuple[str, Child]],
        default: Child,
        field: str | None = None,
        header: str | None = None,
        context: GraphContext | None = None,
        streams: bool = False,
    ) -> None:
        super().__init__(node_id, context, streams)
        self.choice = SwitchChoice.of(cases, default, field, header)

    async def route(self, payload: Any, headers: Headers) -> Any:
        return await self.call(self.choice.pick(payload, headers), payload, headers)

    async def items(self, payload: Any, headers: Headers) -> AsyncGenerator[Any, None]:
        async with aclosing(self.call_stream(self.choice.pick(payload, headers), payload, headers)) as items:
            async for item in items:
                yield item


class SplitterRouter(Router):
    """Sends each request to one route, in proportion to the weights (`SplitChoice`; canary, A/B).

    Called by another router, its choice is made there, as a switch's is."""

    def __init__(
        self,
        node_id: str,
        routes: Sequence[tuple[Child, int]],
        context: GraphContext | None = None,
        streams: bool = False,
    ) -> None:
        super().__init__(node_id, context, streams)
        self.choice = SplitChoice(tuple(c for c, _ in routes), tuple(w for _, w in routes))

    async def route(self, payload: Any, headers: Headers) -> Any:
        return await self.call(self.choice.pick(payload, headers), payload, headers)

    async def items(self, payload: Any, headers: Headers) -> AsyncGenerator[Any, None]:
        async with aclosing(self.call_stream(self.choice.pick(payload, headers), payload, headers)) as items:
            async for item in items:
                yield item
