"""What a router does for a canary: its routes, and at the ingress the choice, mirrors, stats.

A mixin of `router.Router`, kept apart so the router base stays about calling children.
Without a canary (no routes in the router's `user_config`) each method here does nothing
or hands back what it was given: a router then does exactly what it did before canaries.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from servegraph.dag.args import CANARY, ROUTE_HEADER, Settings
from servegraph.runtime.calls import NodeTimeout, failure_body, timeout_of
from servegraph.runtime.ingress import MIRROR_CALLER, Admission
from servegraph.runtime.payload import Headers
from servegraph.runtime.routing import Routing
from servegraph.runtime.stats import CLIENTS, MIRROR, StatsLink
from servegraph.runtime.telemetry import EdgeMetrics, GraphContext, Spans

FAILED_NODE = "servegraph_node"
"""The attribute naming the node that raised, set on what user code raised by the router that
called it (an exception pickles its attributes, so it reaches the ingress through any number
of replicas): the canary's stats name the failing node."""


def mark_failed(exc: BaseException, node: str) -> None:
    """Say `node` raised `exc`, unless a router below already said which node did."""
    target = getattr(exc, "cause", None) or exc
    if not hasattr(target, FAILED_NODE):
        with contextlib.suppress(AttributeError):  # a type without a __dict__: counted at the ingress
            setattr(target, FAILED_NODE, node)


def failed_node(exc: BaseException, ingress: str) -> str:
    """The node a failure happened in: a timeout's or a stream's own, the one a router marked,
    else the ingress."""
    known = failure_body(exc, ingress).get("node")
    if known and known != ingress:
        return str(known)
    target = getattr(exc, "cause", None) or exc
    return str(getattr(target, FAILED_NODE, None) or known or ingress)


class CanaryRoutes:
    """The canary's part of a router (see the module docstring)."""

    node_id: str
    context: GraphContext
    metrics: EdgeMetrics | None
    spans: Spans

    def __init__(self, version: str) -> None:
        self.routing = Routing(version)
        """The canary's routes this router was told (`routing.py`); inactive without a canary."""
        self.admission = Admission()
        self.stats: StatsLink | None = None

    def configure_canary(self, settings: Settings) -> None:
        """New routes, from `reconfigure` (no restart)."""
        self.routing.update(settings, self.context.version)
        if settings.stats is not None and self.stats is None:
            self.stats = StatsLink(f"{self.node_id}:{id(self):x}")

    async def answer(self, payload: Any, headers: Headers) -> Any:
        raise NotImplementedError

    async def route(self, payload: Any, headers: Headers) -> Any:
        raise NotImplementedError

    def stream(self, payload: Any, headers: Headers) -> AsyncGenerator[Any, None]:
        raise NotImplementedError

    def _record_failure(self, caller: str, node: str, timed_out: NodeTimeout | None, headers: Headers) -> None:
        raise NotImplementedError

    def _metrics_for(self, headers: Headers) -> EdgeMetrics | None:
        """The edge metrics labelled with the version serving this request."""
        if self.metrics is None or not self.routing.active:
            return self.metrics
        return self.metrics.at(self.routing.version(headers))

    def _admit(self, caller: str, payload: Any, headers: Headers) -> Headers:
        """At the ingress: the route this request takes (`ingress.py`), and its mirror."""
        settings = self.routing.settings
        headers, mirror = self.admission.admit(settings, self.context.version, payload, headers)
        if mirror and settings.canary is not None:
            copy = {**headers, ROUTE_HEADER: CANARY}
            self.admission.mirror(settings.canary.busy, lambda: self._mirrored(payload, copy))
        if self.stats is not None:
            self.stats.started()
        return headers

    async def _mirrored(self, payload: Any, headers: Headers) -> None:
        """A copy to the canary: recorded with caller `mirror`, its answer and failure dropped."""
        start = time.perf_counter()
        failure: Exception | None = None
        try:
            with self.spans.hop(MIRROR_CALLER, self.node_id, headers, server=True) as sent:
                await self.answer(payload, sent)
        except Exception as e:
            failure = e
            self._record_failure(MIRROR_CALLER, self.node_id, timeout_of(e), headers)
        finally:
            self._served_one(MIRROR_CALLER, headers, time.perf_counter() - start, failure)

    def _served_one(self, caller: str, headers: Headers, seconds: float, failure: BaseException | None) -> None:
        """One request the ingress answered whole (a client's, or a copy): its edge and the stats."""
        metrics = self._metrics_for(headers)
        if metrics is not None:
            metrics.call(caller, self.node_id, seconds)
        self._count(caller, headers, seconds, failure)

    def _count(self, caller: str, headers: Headers, seconds: float, failure: BaseException | None) -> None:
        """The canary's own stats (`stats.py`), when the ingress keeps them."""
        if self.stats is not None:
            failed = None if failure is None else failed_node(failure, self.node_id)
            kind = MIRROR if caller == MIRROR_CALLER else CLIENTS
            self.stats.stats.record(self.routing.version(headers), kind, seconds, failed)

    async def servegraph_call(self, payload: Any, headers: Headers, user_headers: Headers) -> Any:
        """A base router's call redirected to this copy (`routing.py`)."""
        return await self.route(payload, headers)

    async def servegraph_stream(
        self, payload: Any, headers: Headers, user_headers: Headers
    ) -> AsyncGenerator[Any, None]:
        async with aclosing(self.stream(payload, headers)) as items:
            async for item in items:
                yield item
