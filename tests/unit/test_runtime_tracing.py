"""Trace context through routers: each hop a span with OpenTelemetry's SDK, unchanged without it.

Each case runs in its own interpreter: OpenTelemetry's tracer provider can be set once
per process, and "not installed" has to be true from the first import on.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"

GRAPH = """
import asyncio, json, sys
sys.path.insert(0, {here!r})
from test_runtime_calls import http_request, router, user
from servegraph.runtime.routers import EnsembleRouter, SequenceRouter

seen = {{}}

def leaf(name):
    def run(payload, headers=None):
        seen[name] = headers
        return payload
    return run

async def main():
    ens = EnsembleRouter("ens", [user("a", leaf("a"), headers=True), user("b", leaf("b"), headers=True)])
    top = SequenceRouter("top", [router("ens", ens), user("last", leaf("last"), headers=True)])
    response = await top(http_request(b'"p"', {{"traceparent": {traceparent!r}, "tracestate": "v=1"}}))
    assert response.status_code == 200, response.body

asyncio.run(main())
"""

WITH_SDK = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
"""

REPORT_SPANS = """
spans = [
    {"name": s.name, "trace": format(s.context.trace_id, "032x"), "id": format(s.context.span_id, "016x"),
     "parent": format(s.parent.span_id, "016x") if s.parent else None, "attributes": dict(s.attributes)}
    for s in exporter.get_finished_spans()
]
print(json.dumps({"seen": seen, "spans": spans}))
"""

# Ray Serve 2.60 cannot be imported without OpenTelemetry (FastAPI's telemetry and Ray's own
# tracing import it), so "not installed" is made true for servegraph's import of it only.
WITHOUT_OTEL = """
import sys
import ray.serve
import opentelemetry
for name in ("opentelemetry.trace", "opentelemetry.trace.propagation.tracecontext"):
    sys.modules[name] = None  # importing it now raises ImportError, as when not installed
del opentelemetry.trace
"""


def run(script: str) -> dict[str, Any]:
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return out


def graph_script() -> str:
    return textwrap.dedent(GRAPH.format(here=str(HERE), traceparent=TRACEPARENT))


def test_with_opentelemetry_each_hop_is_a_span_of_the_callers_trace() -> None:
    out = run(textwrap.dedent(WITH_SDK) + graph_script() + textwrap.dedent(REPORT_SPANS))
    spans = {s["name"]: s for s in out["spans"]}
    assert set(spans) == {"http -> top", "top -> ens", "ens -> a", "ens -> b", "top -> last"}
    assert {s["trace"] for s in spans.values()} == {TRACE_ID}
    # The tree follows the graph: the caller's span, then the ingress, then each edge.
    assert spans["http -> top"]["parent"] == CLIENT_SPAN
    assert spans["top -> ens"]["parent"] == spans["http -> top"]["id"]
    assert spans["ens -> a"]["parent"] == spans["top -> ens"]["id"]
    assert spans["top -> last"]["attributes"] == {
        "servegraph.graph": "",
        "servegraph.caller": "top",
        "servegraph.node": "last",
    }
    # What a node receives names the span of the hop that reached it, in the same trace.
    assert out["seen"]["last"] == {"traceparent": f"00-{TRACE_ID}-{spans['top -> last']['id']}-01", "tracestate": "v=1"}
    assert out["seen"]["a"]["traceparent"] == f"00-{TRACE_ID}-{spans['ens -> a']['id']}-01"


def test_without_opentelemetry_the_trace_context_passes_through_unchanged() -> None:
    report = (
        "\nfrom servegraph.runtime.telemetry import Spans\n"
        "print(json.dumps({'seen': seen, 'otel': Spans('g')._trace is not None}))\n"
    )
    out = run(textwrap.dedent(WITHOUT_OTEL) + graph_script() + report)
    assert out["otel"] is False
    expected = {"traceparent": TRACEPARENT, "tracestate": "v=1"}
    assert out["seen"] == {"a": expected, "b": expected, "last": expected}


def test_opentelemetry_without_a_tracer_provider_costs_nothing_and_changes_nothing() -> None:
    """Ray images ship OpenTelemetry's API; with no provider set, routers make no spans."""
    out = run(graph_script() + "\nprint(json.dumps({'seen': seen}))\n")
    assert out["seen"]["last"] == {"traceparent": TRACEPARENT, "tracestate": "v=1"}
