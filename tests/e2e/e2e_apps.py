"""User code for the e2e graphs: what a graph author would ship in their image.

Ray workers import it by name (`e2e_apps:...`) because the test head runs with
this directory on PYTHONPATH. Each class is deliberately trivial so a test's
expected output is obvious from the graph.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from ray import serve


class Stamp:
    """Appends its tag to the payload's `trail`: a chain's order shows in the output."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __call__(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        return {**payload, "trail": [*payload.get("trail", []), self.tag]}


class Scale:
    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, payload: Mapping[str, Any]) -> float:
        return float(payload["x"]) * self.factor


@serve.deployment
class Total:
    """Already a Serve Deployment, so the builder renames it with `.options(name=...)`."""

    def __call__(self, parts: Mapping[str, float]) -> dict[str, Any]:
        return {"total": sum(parts.values()), "parts": dict(parts)}


class Tag:
    """Says which branch took the request."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, payload: Any) -> dict[str, Any]:
        return {"tag": self.name, "payload": payload}


class Broken:
    """A version that deploys and answers nothing but failures (the canary suite's bad version)."""

    def __call__(self, payload: Any) -> dict[str, Any]:
        raise RuntimeError("this version is broken")


def echo(payload: Any) -> dict[str, Any]:
    """A function deployment."""
    return {"echo": payload}


class Configurable:
    """Reports its user_config, how often reconfigure ran, and which replica answers."""

    def __init__(self) -> None:
        self.threshold: Any = None
        self.reconfigures = 0

    def reconfigure(self, user_config: Mapping[str, Any]) -> None:
        self.threshold = user_config.get("threshold")
        self.reconfigures += 1

    def __call__(self, request: Any) -> dict[str, Any]:
        context = serve.get_replica_context()
        return {
            "threshold": self.threshold,
            "reconfigures": self.reconfigures,
            "replica_id": context.replica_id.unique_id,
            "pid": os.getpid(),
        }


class Counted:
    """A generator that counts what it does, so a test can see a stream cancelled on the replica.

    The payload says `count` items, `pause_s` between them, and `fail_at` (an index that
    raises instead); `{"stats": true}` answers this replica's counters as one item.
    """

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.stats = {"started": 0, "finished": 0, "cancelled": 0, "produced": 0}

    async def __call__(self, payload: Mapping[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        if payload.get("stats"):
            yield dict(self.stats)
            return
        self.stats["started"] += 1
        try:
            for i in range(int(payload.get("count", 3))):
                if i:
                    await asyncio.sleep(float(payload.get("pause_s", 0)))
                if i == payload.get("fail_at"):
                    raise RuntimeError(f"{self.tag} broke at item {i}")
                self.stats["produced"] += 1
                yield {"tag": self.tag, "i": i}
            self.stats["finished"] += 1
        except (asyncio.CancelledError, GeneratorExit):
            self.stats["cancelled"] += 1
            raise


LEAKED = "postgres://app:hunter2@db:5432/orders"
"""What a careless exception message holds (a password): callers must never see it."""


class Leaky:
    """Fails as user code does, with a message that is nobody's business but the log's."""

    def __call__(self, payload: Any) -> Any:
        raise ConnectionError(f"could not reach {LEAKED}")


class LeakingStream:
    """One item, then a failure like Leaky's."""

    async def __call__(self, payload: Any) -> AsyncGenerator[dict[str, Any], None]:
        yield {"i": 0}
        raise ConnectionError(f"could not reach {LEAKED}")


def span_processors() -> list[Any]:
    """Ray Serve's tracing exporter hook (RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH): every
    finished span as one JSON line appended to $SERVEGRAPH_E2E_SPANS, from every replica."""
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    path = os.environ["SERVEGRAPH_E2E_SPANS"]

    class JsonLines(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            lines = []
            for span in spans:
                assert isinstance(span, ReadableSpan) and span.context is not None
                parent = span.parent
                lines.append(
                    json.dumps(
                        {
                            "name": span.name,
                            "trace": format(span.context.trace_id, "032x"),
                            "id": format(span.context.span_id, "016x"),
                            "parent": format(parent.span_id, "016x") if parent is not None else None,
                            "attributes": dict(span.attributes or {}),
                        }
                    )
                )
            with open(path, "a") as f:
                f.write("".join(line + "\n" for line in lines))
            return SpanExportResult.SUCCESS

    return [SimpleSpanProcessor(JsonLines())]
