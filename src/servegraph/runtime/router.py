"""The router base: how a router calls its children and answers at the ingress.

Shared by the four router kinds (`routers.py`): `call`/`call_stream` (one edge:
timeout, retries, metrics, span), and the ingress answers — HTTP (a JSON body, or a
chunked stream through `wire.py`) and `servegraph.v1.GraphService` over gRPC.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from servegraph.dag.args import STATS_HEADER, decode_settings
from servegraph.runtime import wire
from servegraph.runtime.calls import (
    Child,
    NodeFailed,
    NodeTimeout,
    failed_of,
    failure_body,
    invoke,
    invoke_stream,
    logged,
    timeout_of,
)
from servegraph.runtime.canary import CanaryRoutes, mark_failed
from servegraph.runtime.payload import (
    Headers,
    Limits,
    PayloadRefused,
    collect,
    normalize_headers,
    payload_from_body,
    read_body,
)
from servegraph.runtime.stats import stats_answer
from servegraph.runtime.telemetry import GRPC_CALLER, HTTP_CALLER, EdgeMetrics, GraphContext, Spans, forwarded

logger = logging.getLogger("ray.serve")


class Router(CanaryRoutes):
    """HTTP entry point shared by all routers: request in, JSON out; and the one way to call a child.

    What a router does for a canary (its routes, the choice at the ingress, mirrors, stats)
    is `CanaryRoutes`'s (`canary.py`)."""

    def __init__(self, node_id: str, context: GraphContext | None = None, streams: bool = False) -> None:
        self.node_id = node_id
        self.streams = streams
        self.context = context or GraphContext()
        telemetry = self.context.telemetry
        self.forward_names = telemetry.forward_headers
        self.metrics = EdgeMetrics(self.context) if telemetry.metrics else None
        self.spans = Spans(self.context.graph)
        self.limits = Limits.from_env()
        """What one request may hold at the ingress (`payload.Limits`): the replica's environment."""
        CanaryRoutes.__init__(self, self.context.version)

    def reconfigure(self, config: Mapping[str, Any]) -> None:
        """Serve calls this with the router's `user_config` when a replica starts and on
        every change to it: the graph's name and version arrive here rather than in the
        application's args, so a publish that changes only the version restarts nothing;
        so do a canary's routes (`routing.py`)."""
        settings = decode_settings(config)
        name, version = settings.graph_name, settings.graph_version
        self.context = replace(
            self.context,
            graph=self.context.graph if name is None else name,
            version=self.context.version if version is None else version,
        )
        if self.metrics is not None:
            self.metrics.label(self.context)
        self.spans.graph = self.context.graph
        self.configure_canary(settings)

    async def __call__(self, request: Any) -> Any:
        # A user deployment may call a router through a plain handle too (a stream arrives as a list).
        if not isinstance(request, Request):
            return await self.answer(request, {})
        if STATS_HEADER in request.headers:
            status, body = await stats_answer(self.stats, self.routing, request.headers[STATS_HEADER])
            return json_response(self.node_id, body, status=status)
        try:
            payload = payload_from_body(await read_body(request, self.limits), self.limits)
        except PayloadRefused as e:
            return json_response(self.node_id, e.body(), status=e.http_status)
        headers = self._admit(HTTP_CALLER, payload, normalize_headers(request.headers.items()))
        if self.streams:
            return await self._http_stream(payload, headers)
        start = time.perf_counter()
        failure: Exception | None = None
        self.admission.in_flight += 1
        try:
            with self.spans.hop(HTTP_CALLER, self.node_id, headers, server=True) as sent:
                result = await self.route(payload, sent)
        except Exception as e:
            failure = e
            timed_out = timeout_of(e)
            self._record_failure(HTTP_CALLER, self.node_id, timed_out, headers)
            if timed_out is None:
                raise
            logger.warning("servegraph node %r: %s", self.node_id, timed_out)
            return json_response(self.node_id, timed_out.body(), status=504)
        finally:
            self.admission.in_flight -= 1
            self._served_one(HTTP_CALLER, headers, time.perf_counter() - start, failure)
        return json_response(self.node_id, result)

    async def _http_stream(self, payload: Any, headers: Headers) -> Response:
        """A chunked response whose first chunk leaves as soon as the first item exists.

        The first item is awaited here, so a graph that fails before producing anything
        answers 500/504 like a unary one; later failures become the body's error item.
        """
        events = wire.wants_events(headers)
        items = self.served(HTTP_CALLER, payload, headers)
        try:
            first = await anext(items)
        except StopAsyncIteration:
            return StreamingResponse(iter(()), media_type=wire.SSE if events else wire.NDJSON)
        except Exception as e:
            timed_out = timeout_of(e)
            if timed_out is None:
                raise
            return json_response(self.node_id, timed_out.body(), status=504)
        return StreamingResponse(
            wire.chunks(self.node_id, _prepend(first, items), events), media_type=wire.SSE if events else wire.NDJSON
        )

    def served(self, caller: str, payload: Any, headers: Headers) -> AsyncGenerator[Any, None]:
        """The stream an ingress serves to `caller` (HTTP or gRPC), recorded as that edge."""
        return self._recorded(caller, self.node_id, headers, lambda sent: self.stream(payload, sent), server=True)

    async def _recorded(
        self,
        caller: str,
        node: str,
        headers: Headers,
        open_items: Callable[[Headers], AsyncGenerator[Any, None]],
        server: bool = False,
    ) -> AsyncGenerator[Any, None]:
        """A stream over one edge with its metrics; the span covers the call until the first item
        (a span cannot stay open across yields: the items are sent from another task)."""
        start = time.perf_counter()
        count = 0
        metrics = self._metrics_for(headers)
        failure: Exception | None = None
        self.admission.in_flight += server
        try:
            with self.spans.hop(caller, node, headers, server=server) as sent:
                items = open_items(sent)
                try:
                    first = await anext(items)
                except StopAsyncIteration:
                    return
            async with aclosing(items):
                count = 1
                if metrics is not None:
                    metrics.first_item(caller, node, time.perf_counter() - start)
                yield first
                async for item in items:
                    count += 1
                    yield item
        except Exception as e:
            failure = e
            self._record_failure(caller, node, timeout_of(e), headers)
            raise
        finally:
            self.admission.in_flight -= server
            if metrics is not None:
                metrics.streamed(caller, node, count, time.perf_counter() - start)
            if server:
                self._count(caller, headers, time.perf_counter() - start, failure)

    async def answer(self, payload: Any, headers: Headers) -> Any:
        """The whole result: a stream's items as one list, within `payload.collect`'s limits."""
        if self.streams:
            async with aclosing(self.stream(payload, headers)) as items:
                return await collect(items, self.limits)
        return await self.route(payload, headers)

    async def route(self, payload: Any, headers: Headers) -> Any:
        raise NotImplementedError

    async def stream(self, payload: Any, headers: Headers) -> AsyncGenerator[Any, None]:
        """The output as items: a streaming router's own, or a unary router's one answer."""
        if self.streams:
            async with aclosing(self.items(payload, headers)) as items:
                async for item in items:
                    yield item
        else:
            yield await self.route(payload, headers)

    def items(self, payload: Any, headers: Headers) -> AsyncGenerator[Any, None]:
        """A streaming router's items; routers whose children may stream override it."""
        raise NotImplementedError

    async def Call(self, request: Any, grpc_context: Any = None) -> Any:
        """GraphService.Call: the application's result (a CallResponse), or the error naming the node.

        Ray Serve passes `grpc_context` (its `RayServegRPCContext`) to a method that names it:
        the headers are its metadata, and a refused payload's status is set there (its proxy
        sends it)."""
        from servegraph.runtime import grpcwire

        try:
            payload, headers = grpcwire.unpack(request, self.limits, grpc_context)
        except PayloadRefused as e:
            return grpcwire.refused(e, grpc_context)
        headers = self._admit(GRPC_CALLER, payload, headers)
        start = time.perf_counter()
        failure: Exception | None = None
        self.admission.in_flight += 1
        try:
            with self.spans.hop(GRPC_CALLER, self.node_id, headers, server=True) as sent:
                return grpcwire.result(await self.answer(payload, sent))
        except PayloadRefused as e:  # a stream too long to answer as one
            failure = e
            self._record_failure(GRPC_CALLER, self.node_id, None, headers)
            return grpcwire.refused(e, grpc_context)
        except Exception as e:
            failure = e
            self._record_failure(GRPC_CALLER, self.node_id, timeout_of(e), headers)
            return grpcwire.failed(failure_body(e, self.node_id))
        finally:
            self.admission.in_flight -= 1
            self._served_one(GRPC_CALLER, headers, time.perf_counter() - start, failure)

    async def Stream(self, request: Any, grpc_context: Any = None) -> AsyncGenerator[Any, None]:
        """GraphService.Stream: the items as they are produced; a failure ends it with an error."""
        from servegraph.runtime import grpcwire

        try:
            payload, headers = grpcwire.unpack(request, self.limits, grpc_context)
        except PayloadRefused as e:
            yield grpcwire.stream_refused(e, grpc_context)
            return
        headers = self._admit(GRPC_CALLER, payload, headers)
        try:
            async with aclosing(self.served(GRPC_CALLER, payload, headers)) as items:
                async for item in items:
                    yield grpcwire.item(item)
        except Exception as e:
            yield grpcwire.stream_failed(failure_body(e, self.node_id))

    async def call(self, child: Child, payload: Any, headers: Headers, caller: str | None = None) -> Any:
        """Call one child over its edge: timeout, retries, metrics, span, forwarded headers.

        `caller` names the edge's upper end when it is not this router: a switch or
        splitter child's choice is made here, its call recorded as the switch's."""
        caller = caller or self.node_id
        start = time.perf_counter()
        metrics = self._metrics_for(headers)
        try:
            with self.spans.hop(caller, child.id, headers) as sent:
                opener = self.routing.opener(child, headers, stream=False)  # a canary's copy
                user_headers = forwarded(sent, self.forward_names) if child.takes_headers or opener else sent
                if opener is None and child.choice is not None:
                    opener = self._choose
                return await invoke(child, payload, sent, user_headers, self._retried_from(caller, headers), opener)
        except Exception as e:
            mark_failed(e, child.id)
            self._record_failure(caller, child.id, timeout_of(e), headers)
            raise
        finally:
            if metrics is not None:
                metrics.call(caller, child.id, time.perf_counter() - start)

    async def call_stream(
        self, child: Child, payload: Any, headers: Headers, caller: str | None = None
    ) -> AsyncGenerator[Any, None]:
        """Call a streaming child over its edge: items as they come, recorded like `call`.

        A failure names the node it happened in (`NodeFailed`), since by then the
        client may hold items already and gets the error as the stream's last item.
        """
        caller = caller or self.node_id

        def open_items(sent: Headers) -> AsyncGenerator[Any, None]:
            opener = self.routing.opener(child, headers, stream=True)  # a canary's copy
            user_headers = forwarded(sent, self.forward_names) if child.takes_headers or opener else sent
            if opener is None and child.choice is not None:
                opener = self._choose_stream
            return invoke_stream(child, payload, sent, user_headers, self._retried_from(caller, headers), opener)

        try:
            async with aclosing(self._recorded(caller, child.id, headers, open_items)) as items:
                async for item in items:
                    yield item
        except Exception as e:
            known = timeout_of(e) or failed_of(e)
            if known is not None:
                raise known from None
            raise NodeFailed(child.id, logged(e, child.id)) from e

    def _choose(self, switch: Child, payload: Any, headers: Headers, _: Headers) -> Any:
        """One attempt at a switch or splitter child: its choice, made here (`choice.py`)."""
        assert switch.choice is not None
        chosen = switch.choice.pick(payload, headers)
        return asyncio.ensure_future(self.call(chosen, payload, headers, caller=switch.id))

    def _choose_stream(self, switch: Child, payload: Any, headers: Headers, _: Headers) -> LocalStream:
        assert switch.choice is not None
        chosen = switch.choice.pick(payload, headers)
        return LocalStream(self.call_stream(chosen, payload, headers, caller=switch.id))

    def _retried_from(self, caller: str, headers: Headers) -> Callable[[str, str], None]:
        metrics = self._metrics_for(headers)

        def retried(node: str, reason: str) -> None:
            if metrics is not None:
                metrics.retried(caller, node, reason)

        return retried

    def _record_failure(self, caller: str, node: str, timed_out: NodeTimeout | None, headers: Headers) -> None:
        metrics = self._metrics_for(headers)
        if metrics is not None:
            metrics.failed(caller, node, "error" if timed_out is None else "timeout")


class LocalStream:
    """A stream made in this process, shaped like a handle's streaming response
    (`__anext__`, `cancel()`), so one edge's timeouts and retries wrap it unchanged."""

    def __init__(self, items: AsyncGenerator[Any, None]) -> None:
        self._items = items
        self._closing: asyncio.Future[None] | None = None

    async def __anext__(self) -> Any:
        return await anext(self._items)

    def cancel(self) -> None:
        """Close the generator, and with it whatever it called (invoke_stream calls this
        when it stops early, never while an item is awaited)."""
        self._closing = asyncio.ensure_future(self._items.aclose())


async def _prepend(first: Any, rest: AsyncGenerator[Any, None]) -> AsyncGenerator[Any, None]:
    async with aclosing(rest):
        yield first
        async for item in rest:
            yield item


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
