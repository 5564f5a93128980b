"""How servegraph runs kopf: watch-only, stateless on the objects, cheap per event."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import kopf

from servegraph.names import GROUP, PLURAL


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

    kopf keeps on.create/on.update/on.delete/on.resume/on.field handlers in one
    registry of "changing" handlers and has no public accessor for it; reading
    the private attribute here is what lets such a handler fail loudly, once,
    instead of misbehaving silently on every event.
    """
    changing = registry._changing.get_all_handlers()
    if changing:
        ids = ", ".join(sorted(str(h.id) for h in changing))
        raise RuntimeError(
            f"kopf change handlers registered ({ids}), but the operator runs kopf with NoDiffBase, under which "
            "they would not work: use on.event handlers and let the reconciler compare, or drop NoDiffBase"
        )


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
    if servegraph_selector:
        settings.watching.label_selectors[GROUP, PLURAL] = servegraph_selector
