"""What a router records and passes on for each call it makes: metrics, trace context, headers.

Metrics go through `ray.serve.metrics`, the way Ray Serve exports application metrics:
Ray's metrics agent on every node serves them on its Prometheus endpoint (KubeRay's
`metrics` port, 8080) with Serve's own `application`, `deployment` and `replica` labels
added, next to Ray Serve's per-deployment metrics. Ours add what Ray cannot know: the
graph, its version and the edge (`caller` → `node`).

Trace context is forwarded as W3C `traceparent`/`tracestate` without any tracing
library. When OpenTelemetry's API is importable and a tracer provider is set (Ray Serve
sets one when its tracing is on), each hop is also a span and the forwarded
`traceparent` names that span. OpenTelemetry is imported when a router starts, never
when the application is built: the builder needs nothing but Ray.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from servegraph.dag.model import Telemetry

TRACE_HEADERS = ("traceparent", "tracestate")
HTTP_CALLER = "http"
"""The `caller` of the hop from Serve's HTTP proxy into the ingress router."""
GRPC_CALLER = "grpc"
"""The `caller` of the hop from Serve's gRPC proxy into the ingress router."""
LATENCY_BUCKETS_MS = [1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000]

# Prometheus names (Ray prefixes `ray_`, and counters get `_total`).
REQUESTS = "servegraph_requests"
ERRORS = "servegraph_request_errors"
RETRIES = "servegraph_request_retries"
LATENCY = "servegraph_request_latency_ms"
STREAMS = "servegraph_streams"
ITEMS = "servegraph_stream_items"
FIRST_ITEM = "servegraph_stream_first_item_ms"
EDGE_TAGS = ("graph", "graph_version", "caller", "node")


@dataclass(frozen=True)
class GraphContext:
    """What every router of an application is told about the graph it belongs to."""

    graph: str = ""
    version: str = ""
    telemetry: Telemetry = field(default_factory=Telemetry)


def forwarded(headers: Mapping[str, str], names: tuple[str, ...]) -> dict[str, str]:
    """The headers a user deployment receives: the trace context and the configured names."""
    return {name: headers[name] for name in (*TRACE_HEADERS, *names) if name in headers}


class EdgeMetrics:
    """Count, errors, retries and latency of one router's calls, by caller and node called.

    Tag dicts are built once per edge: recording then merges no dictionaries beyond
    what Ray itself does. A failure's `reason` is `timeout` when a node timed out (this
    edge's own or one further down), else `error`.
    """

    requests: Any
    errors: Any
    retries: Any
    latency: Any
    streams: Any
    items: Any
    first_items: Any

    def __init__(self, context: GraphContext, version: str | None = None, shared: EdgeMetrics | None = None) -> None:
        self.version = version
        """The `graph_version` every record of this view carries (None: the default tag)."""
        self._tags: dict[tuple[str, ...], dict[str, str]] = {}
        self._views: dict[str, EdgeMetrics] = {}
        self.context = context
        if shared is not None:
            self.requests, self.errors, self.retries, self.latency = (
                shared.requests,
                shared.errors,
                shared.retries,
                shared.latency,
            )
            self.streams, self.items, self.first_items = shared.streams, shared.items, shared.first_items
            return
        from ray.serve import metrics as serve_metrics  # a Ray module, already loaded with ray.serve

        metrics: Any = serve_metrics  # its stubs say tag_keys is a 1-tuple

        self.requests = metrics.Counter(REQUESTS, "Calls servegraph routers made, by edge", EDGE_TAGS)
        self.errors = metrics.Counter(
            ERRORS, "Calls that failed after their retries, by edge and reason", (*EDGE_TAGS, "reason")
        )
        self.retries = metrics.Counter(
            RETRIES, "Attempts retried, by edge and the reason of the failed attempt", (*EDGE_TAGS, "reason")
        )
        self.latency = metrics.Histogram(
            LATENCY, "Latency of a router's call to a node, retries included", LATENCY_BUCKETS_MS, EDGE_TAGS
        )
        self.streams = metrics.Counter(STREAMS, "Streams a router consumed, by edge", EDGE_TAGS)
        self.items = metrics.Counter(ITEMS, "Items that passed over a streaming edge", EDGE_TAGS)
        self.first_items = metrics.Histogram(
            FIRST_ITEM, "Time from a streaming call to its first item", LATENCY_BUCKETS_MS, EDGE_TAGS
        )
        self.label(context)

    def at(self, version: str) -> EdgeMetrics:
        """The same metrics, every record labelled with `version`: during a canary a router
        serves two versions, and each request's edges carry the one that served it."""
        if version == self.context.version:
            return self
        view = self._views.get(version)
        if view is None:
            view = self._views[version] = EdgeMetrics(self.context, version, self)
        return view

    def label(self, context: GraphContext) -> None:
        """Label every later record with this graph and version (a router's `reconfigure`)."""
        self.context = context
        self._views.clear()
        defaults = {"graph": context.graph, "graph_version": context.version}
        for metric in (
            self.requests,
            self.errors,
            self.retries,
            self.latency,
            self.streams,
            self.items,
            self.first_items,
        ):
            metric.set_default_tags(dict(defaults))

    def _edge(self, caller: str, node: str, reason: str | None = None) -> dict[str, str]:
        key = (caller, node) if reason is None else (caller, node, reason)
        tags = self._tags.get(key)
        if tags is None:
            tags = (
                {"caller": caller, "node": node}
                if reason is None
                else {"caller": caller, "node": node, "reason": reason}
            )
            if self.version is not None:
                tags["graph_version"] = self.version
            self._tags[key] = tags
        return tags

    def call(self, caller: str, node: str, seconds: float) -> None:
        tags = self._edge(caller, node)
        self.requests.inc(1, tags)
        self.latency.observe(seconds * 1000.0, tags)

    def first_item(self, caller: str, node: str, seconds: float) -> None:
        self.first_items.observe(seconds * 1000.0, self._edge(caller, node))

    def streamed(self, caller: str, node: str, items: int, seconds: float) -> None:
        """A stream over the edge ended (done, failed or abandoned): one call, its items, its duration.

        Items are counted once per stream, not per item, to keep recording off the hot path.
        """
        tags = self._edge(caller, node)
        self.requests.inc(1, tags)
        self.streams.inc(1, tags)
        if items:
            self.items.inc(items, tags)
        self.latency.observe(seconds * 1000.0, tags)

    def failed(self, caller: str, node: str, reason: str) -> None:
        self.errors.inc(1, self._edge(caller, node, reason))

    def retried(self, caller: str, node: str, reason: str) -> None:
        self.retries.inc(1, self._edge(caller, node, reason))


class Spans:
    """One OpenTelemetry span per hop, when OpenTelemetry can record them; else nothing.

    Without a tracer provider (OpenTelemetry's API alone, or not installed) the
    headers pass through unchanged, so the caller's trace id still reaches every node.
    """

    def __init__(self, graph: str) -> None:
        self.graph = graph
        try:
            from opentelemetry import trace
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            self._trace: Any = None
            return
        self._trace = trace
        self._propagator = TraceContextTextMapPropagator()
        self._tracer: Any = None

    def _active(self) -> bool:
        trace = self._trace
        return trace is not None and not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)

    @contextlib.contextmanager
    def hop(self, caller: str, node: str, headers: dict[str, str], server: bool = False) -> Iterator[dict[str, str]]:
        """A span around one call; yields the headers to send, their `traceparent` naming the span.

        The parent is the span already current (Ray Serve's, when its tracing is on),
        else the trace context the request brought.
        """
        if not self._active():
            yield headers
            return
        trace = self._trace
        if self._tracer is None:
            self._tracer = trace.get_tracer("servegraph.runtime")
        current = trace.get_current_span().get_span_context()
        parent = None if current.is_valid else self._propagator.extract(headers)
        kind = trace.SpanKind.SERVER if server else trace.SpanKind.CLIENT
        attributes = {"servegraph.graph": self.graph, "servegraph.caller": caller, "servegraph.node": node}
        with self._tracer.start_as_current_span(f"{caller} -> {node}", context=parent, kind=kind) as span:
            span.set_attributes(attributes)
            out = {k: v for k, v in headers.items() if k not in TRACE_HEADERS}
            self._propagator.inject(out)
            yield out
