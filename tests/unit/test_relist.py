"""A watch's re-list is compared with what the reconciler holds (issue 44, item 3).

After a watch gap (the operator paused, the API server restarted, etcd compacted: 410 Gone)
kopf lists again and delivers every object that exists, but no DELETED for what went in the
gap: five RayServices deleted then were never recreated, their ServeGraphs still saying
Applied=True UpToDate. The list's end is now compared with the cache.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import kopf
import pytest
from reconcile_support import KEY, NAME, NS, Cluster

from servegraph.names import GROUP, PLURAL, RAY_GROUP, RAY_PLURAL
from servegraph.operator.cache import RAYSERVICES, SERVEGRAPHS
from servegraph.operator.run import kopf_private, kopf_settings


async def running() -> Cluster:
    c = Cluster()
    await c.started()
    assert c.condition("Applied") == ("True", "UpToDate")
    c.queue.discard(KEY)  # what the start's deliveries queued: handled
    return c


async def test_a_rayservice_deleted_in_a_watch_gap_is_created_again() -> None:
    c = await running()
    del c.api.rayservices[KEY]  # deleted while the operator was not watching: no DELETED comes
    mark = c.reconciler.listing()
    c.reconciler.relisted(RAYSERVICES, None, [], mark)  # the re-list's end: it is not there
    assert len(c.queue) == 1, "its ServeGraph was not queued"
    await c.reconcile()
    assert KEY in c.api.rayservices, "the RayService deleted in the gap was never created again"
    assert c.api.calls.count("apply_rayservice") == 1
    assert c.condition("Applied") == ("True", "UpToDate")


async def test_what_the_list_returns_and_what_was_stored_since_it_began_are_left_alone() -> None:
    c = await running()
    mark = c.reconciler.listing()
    c.reconciler.relisted(RAYSERVICES, None, [KEY], mark)  # listed: still there
    assert len(c.queue) == 0
    mark = c.reconciler.listing()
    c.watch_rayservice()  # stored after the list began: may be newer than the list
    c.queue.discard(KEY)  # what that delivery queued
    c.reconciler.relisted(RAYSERVICES, None, [], mark)
    assert len(c.queue) == 0 and c.reconciler.cache.rayservice(KEY) is not None
    c.reconciler.relisted(RAYSERVICES, "another-namespace", [], c.reconciler.listing())  # not that list's scope
    assert c.reconciler.cache.rayservice(KEY) is not None


async def test_a_servegraph_deleted_in_a_watch_gap_is_forgotten() -> None:
    c = await running()
    c.reconciler.relisted(SERVEGRAPHS, NS, [], c.reconciler.listing())
    assert c.reconciler.cache.head(KEY) is None
    assert c.reconciler.cache.sizes()["memory"] == 0 and len(c.queue) == 0


async def test_kopfs_lists_reach_the_reconciler_through_the_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf's watch lists through `fetching.fetch_objs`; the adapter's wrapper yields the same
    chunks and, at the end, hands the reconciler every object the list returned."""
    c = await running()
    body = copy.deepcopy(c.api.rayservices[KEY])
    calls: list[tuple[Any, ...]] = []

    async def kopfs_own(**kwargs: Any) -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
        calls.append(tuple(sorted(kwargs)))
        yield [body], "41"
        yield [], "41"

    from kopf._cogs.clients import fetching

    monkeypatch.setattr(fetching, "fetch_objs", kopfs_own)  # kopf's own, as the adapter finds it
    monkeypatch.setattr(kopf_private, "_original_fetch_objs", None)
    kopf_settings.compare_listings(c.reconciler)
    try:
        rayservices = kopf.Resource(RAY_GROUP, "v1", RAY_PLURAL, namespaced=True)
        chunks = [
            chunk
            async for chunk in fetching.fetch_objs(settings=None, resource=rayservices, namespace=None, logger=None)
        ]  # type: ignore[arg-type]
        assert chunks == [([body], "41"), ([], "41")]
        assert calls == [("logger", "namespace", "resource", "settings")]
        assert len(c.queue) == 0, "a RayService the list returned was taken for deleted"

        del body["metadata"]["name"]  # now the list returns something else: ours is gone
        async for _ in fetching.fetch_objs(settings=None, resource=rayservices, namespace=None, logger=None):  # type: ignore[arg-type]
            pass
        assert len(c.queue) == 1 and c.reconciler.cache.rayservice(KEY) is None

        servegraphs = kopf.Resource(GROUP, "v1alpha1", PLURAL, namespaced=True)
        async for _ in fetching.fetch_objs(settings=None, resource=servegraphs, namespace=NS, logger=None):  # type: ignore[arg-type]
            pass
        assert c.reconciler.cache.head((NS, NAME)) is None
    finally:
        kopf_settings.compare_listings(None)
    assert fetching.fetch_objs is kopfs_own, "kopf's own function was not put back"


def test_servegraphs_are_synced_once_every_watched_scope_listed_and_delivered() -> None:
    from servegraph.operator.metrics import Metrics
    from servegraph.operator.queue import WorkQueue
    from servegraph.operator.reconcile import Reconciler

    c = Cluster()
    sg = copy.deepcopy(c.body)
    for watched, scopes in ((None, [None]), (("team-a", "team-b"), ["team-a", "team-b"]), (("team-*",), ["team-a"])):
        r = Reconciler(c.api, c.registry, Metrics(), WorkQueue(), watched=watched)
        assert not r.servegraphs_synced(), "nothing listed yet"
        for scope in scopes:
            r.relisted(SERVEGRAPHS, scope, [KEY] if scope in (None, NS) else [], r.listing())
        assert not r.servegraphs_synced(), f"{watched}: {KEY} listed but not delivered"
        r.servegraph_changed(sg)
        assert r.servegraphs_synced(), watched
    partial = Reconciler(c.api, c.registry, Metrics(), WorkQueue(), watched=("team-a", "team-b"))
    partial.relisted(SERVEGRAPHS, "team-b", [], partial.listing())
    partial.relisted(RAYSERVICES, "team-a", [], partial.listing())
    assert not partial.servegraphs_synced(), "team-a's ServeGraphs were not listed"
