"""How servegraph runs kopf: watch-only, stateless on the objects, cheap per event."""

from __future__ import annotations

import json
import logging
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

import kopf
import orjson

from servegraph.names import (
    GATEWAY_GROUP,
    GROUP,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PLURAL,
    RAY_GROUP,
    RAY_PLURAL,
    ROUTE_PLURAL,
)
from servegraph.operator.cache import RAYSERVICES, SERVEGRAPHS
from servegraph.operator.reconcile import Reconciler
from servegraph.operator.run import kopf_private


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's change detection, switched off.

    Why it exists: kopf deep-copies every watched object on every event (an
    "essence" to diff against for on.create/on.update handlers) even when, as
    here, only on.event handlers exist and nothing reads it: 6 % of the
    operator's CPU at 1,000 ServeGraphs, most of it copying RayService specs.
    The reconciler compares what it needs itself (spec hash, generation, the
    RayService it last applied).

    Why it is dangerous: with nothing stored, kopf takes every event for the
    object's creation. An on.create handler would run on every watch event and
    on.update, on.field and on.resume handlers never. `refuse_change_handlers`
    stops the operator at start-up before that can happen.
    """

    def build(self, *, body: kopf.Body, extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None  # never stored: see store()

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        """Nothing to keep, and nothing may be written: the operator adds no annotations."""
        return None


def refuse_change_handlers(registry: kopf.OperatorRegistry) -> None:
    """Fail at start-up if a handler needs the diff base NoDiffBase does not keep.

    kopf has no public accessor for them (`kopf_private.changing_handlers` reads its
    private registry): what lets such a handler fail loudly, once, instead of
    misbehaving silently on every event.
    """
    changing = kopf_private.changing_handlers(registry)
    if changing:
        ids = ", ".join(changing)
        raise RuntimeError(
            f"kopf change handlers registered ({ids}), but the operator runs kopf with NoDiffBase, under which "
            "they would not work: use on.event handlers and let the reconciler compare, or drop NoDiffBase"
        )


_echo: Callable[[Mapping[str, Any]], bool] | None = None


def drop_echoes(echo: Callable[[Mapping[str, Any]], bool] | None) -> None:
    """From now on, a watch event for which `echo` is true reaches kopf as a BOOKMARK, which
    kopf takes the resource version of and passes to no handler (`run.echoes`); None: none."""
    global _echo
    _echo = echo


def compare_listings(reconciler: Reconciler | None) -> None:
    """From now on, each list kopf's watches make of ServeGraphs and RayServices (at the start,
    and again after a watch gap: 410 Gone) is compared with what the reconciler holds, so what
    was deleted in the gap is forgotten or repaired (`Reconciler.relisted`); None: not."""
    if reconciler is None:
        kopf_private.observe_listings(None)
        return
    kinds = {(GROUP, PLURAL): SERVEGRAPHS, (RAY_GROUP, RAY_PLURAL): RAYSERVICES}

    def started(group: str, plural: str, namespace: str | None) -> int:
        return reconciler.listing()

    def ended(group: str, plural: str, namespace: str | None, listed: frozenset[tuple[str, str]], mark: int) -> None:
        kind = kinds.get((group, plural))
        if kind is not None:
            reconciler.relisted(kind, namespace, listed, mark)

    kopf_private.observe_listings(started, ended)


def _watch_loads(text: str) -> Any:
    try:
        event = orjson.loads(text)
    except orjson.JSONDecodeError:
        event = json.loads(text)  # what orjson refuses, the standard library decides (and words the error)
    if _echo is not None and isinstance(event, dict) and _echo(event):
        version = event["object"]["metadata"].get("resourceVersion")
        return {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": version}}}
    drop_field_sets(event)
    return event


def drop_field_sets(event: Any) -> None:
    """Drop each managedFields entry's `fieldsV1` from a watch event's object, keeping who wrote it.

    `fieldsV1` is the set of fields a manager owns: a second copy of the object's shape,
    near half the dicts of a RayService as we apply it. Nothing here reads it (the
    conflict message names the managers only, `drift._whose`); but kopf's per-object
    worker holds each object's last event for seconds, and every dict alive at a garbage
    collection is walked by it: at 3,000 ServeGraphs the collector took 6 % of the
    operator's CPU. Stripped as decoded, the sets are freed at once. controller-runtime's
    `TransformStripManagedFields` does the same for Go controllers, dropping the whole list.
    """
    obj = event.get("object") if isinstance(event, dict) else None
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    entries = meta.get("managedFields") if isinstance(meta, dict) else None
    if isinstance(entries, list):
        for entry in entries:
            if isinstance(entry, dict):
                entry.pop("fieldsV1", None)


_WATCH_JSON = types.SimpleNamespace(loads=_watch_loads)


def decode_watch_events_with_orjson() -> bool:
    """Have kopf decode watch events with orjson: a third of the standard library's CPU.

    kopf reads every event of a watch with `json.loads` and has no setting for the decoder
    (`kopf_private.install_watch_decoder` replaces it). A RayService event with a tenant's
    serve config (~15 KiB) decodes in 24 µs instead of 74. The results are equal for what
    the API server sends: it never writes an integer beyond 64 bits (its own decoder turns
    such a number into a float), where orjson would round. If a kopf release reads events
    another way, nothing is replaced: False, and a warning.
    """
    if kopf_private.install_watch_decoder(_WATCH_JSON):
        return True
    logging.getLogger("servegraph.operator").warning("kopf no longer reads watch events with json.loads: left as is")
    return False


def configure(settings: kopf.OperatorSettings, servegraph_selector: str = "") -> None:
    """`servegraph_selector`: the shard's label selector (`sharding.Shard.selector`), sent to
    the API server with the ServeGraph list and watch, so a shard never receives the others'."""
    settings.posting.enabled = False  # we post our own Events, on transitions only
    settings.peering.standalone = True
    settings.scanning.disabled = True  # resources resolved once at start: no CRD watch, no RBAC for it
    settings.watching.server_timeout = 600
    # Every call kopf makes has a timeout too: a stalled API connection costs a reconnect, not a hang.
    settings.watching.client_timeout = 660
    settings.watching.connect_timeout = 10
    settings.networking.connect_timeout = 10
    settings.networking.request_timeout = 60
    settings.persistence.diffbase_storage = NoDiffBase()
    decode_watch_events_with_orjson()
    if servegraph_selector:
        settings.watching.label_selectors[GROUP, PLURAL] = servegraph_selector
    # The HTTPRoutes of spec.expose: the operator's own only (KubeRay's and everyone else's are not delivered).
    settings.watching.label_selectors[GATEWAY_GROUP, ROUTE_PLURAL] = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
