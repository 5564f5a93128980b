"""The operator's own writes, coming back on its watches: dropped before kopf handles them.

Each write comes back as a watch event: the status a reconcile wrote, the RayService it
applied. The reconciler holds what those events carry already (`WatchCache.echo_servegraph`,
`echo_rayservice`) and only returned on them; but kopf spent ~0.4 ms of CPU on each before
calling the handler (a per-object worker task, its memories, loggers, causes), and they are
two of the three events a new ServeGraph brings. Recognised as they are decoded, they cost
the decoding only, and kopf keeps no per-object memory for a RayService only the operator
has written.

The handlers must see every other event in order, as before: an echo is recognised only
while no earlier event of the same object waits in kopf's queue for its handler. The
handlers report each event they get (`handled`); what was passed on and not yet handled is
counted per object. Were an event never to reach its handler (kopf skips the events of an
object whose handlers keep failing), that object's echoes would only go on reaching the
handler, as before this filter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from servegraph.names import GROUP, KIND, RAY_GROUP, RAY_VERSION
from servegraph.operator.cache import WatchCache

Kind = Literal["servegraph", "rayservice"]
SERVEGRAPH: Kind = "servegraph"
RAYSERVICE: Kind = "rayservice"

_RAY_API_VERSION = f"{RAY_GROUP}/{RAY_VERSION}"
_CHANGES = frozenset({"ADDED", "MODIFIED", "DELETED"})


def _kind(obj: Mapping[str, Any]) -> Kind | None:
    kind = obj.get("kind")
    if kind == KIND and str(obj.get("apiVersion", "")).startswith(f"{GROUP}/"):
        return SERVEGRAPH
    if kind == "RayService" and obj.get("apiVersion") == _RAY_API_VERSION:
        return RAYSERVICE
    return None


class EchoFilter(Collector):
    """Also a metrics collector: `servegraph_watch_echoes_dropped_total` by `kind`."""

    def __init__(self, cache: WatchCache) -> None:
        self._cache = cache
        self._waiting: dict[tuple[Kind, str, str], int] = {}
        self.dropped: dict[Kind, int] = {SERVEGRAPH: 0, RAYSERVICE: 0}

    def drop(self, event: Mapping[str, Any]) -> bool:
        """Whether a decoded watch event is the operator's own write coming back; else it is
        counted as waiting for its handler."""
        obj = event.get("object")
        if event.get("type") not in _CHANGES or not isinstance(obj, Mapping):
            return False
        kind = _kind(obj)
        if kind is None:
            return False
        meta = obj.get("metadata") or {}
        ident = (kind, str(meta.get("namespace", "")), str(meta.get("name", "")))
        if event["type"] != "DELETED" and ident not in self._waiting:
            key = (ident[1], ident[2])
            version = meta.get("resourceVersion")
            cache = self._cache
            echo = cache.echo_servegraph if kind == SERVEGRAPH else cache.echo_rayservice
            if echo(key, version):
                self.dropped[kind] += 1
                return True
        self._waiting[ident] = self._waiting.get(ident, 0) + 1
        return False

    def handled(self, kind: Kind, body: Mapping[str, Any]) -> None:
        """A handler got an event of this object (one listed at start was never counted)."""
        meta = body.get("metadata") or {}
        ident = (kind, str(meta.get("namespace", "")), str(meta.get("name", "")))
        waiting = self._waiting.get(ident)
        if waiting is None:
            return
        if waiting > 1:
            self._waiting[ident] = waiting - 1
        else:
            del self._waiting[ident]

    def waiting(self) -> int:
        """Events passed on and not yet handled: what must return to 0 when kopf is idle."""
        return sum(self._waiting.values())

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "servegraph_watch_echoes_dropped",
            "Watch events that were the operator's own writes coming back, dropped before kopf handled them",
            labels=["kind"],
        )
        for kind, n in self.dropped.items():
            family.add_metric([kind], n)
        yield family
