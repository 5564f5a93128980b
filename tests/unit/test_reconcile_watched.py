"""When the watch delivers every RayService (handlers.py's index), a RayService it never delivered
does not exist: a new ServeGraph creates its RayService without reading it first, and one made
by hand is refused from what the watch delivered of it, never written."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from reconcile_support import KEY, NAME, NS, Cluster

from servegraph.kube import KubeError
from servegraph.operator.cache import WatchCache
from servegraph.operator.kuberay import Live
from servegraph.operator.reconcile import RetryLater

HAND_MADE: dict[str, Any] = {
    "apiVersion": "ray.io/v1",
    "kind": "RayService",
    "metadata": {
        "name": NAME,
        "namespace": NS,
        "resourceVersion": "7",
        "managedFields": [{"manager": "kubectl-create"}, {"manager": "kuberay-operator", "subresource": "status"}],
    },
    "spec": {"serveConfigV2": "applications: []\n"},
}


def watched() -> Cluster:
    c = Cluster()
    c.reconciler.cache.rayservices_complete = True
    return c


async def test_a_new_servegraph_creates_its_rayservice_without_reading_it_first() -> None:
    c = watched()
    c.watch_servegraph()
    await c.reconcile()
    assert "get_rayservice" not in c.api.calls
    assert c.api.calls.count("apply_rayservice") == 1 and KEY in c.api.rayservices
    assert c.condition("Applied") == ("True", "UpToDate")


async def test_a_rayservice_made_by_hand_is_refused_from_its_record_unread_and_unwritten() -> None:
    c = watched()
    c.api.rayservices[KEY] = copy.deepcopy(HAND_MADE)
    c.reconciler.rayservice_changed(copy.deepcopy(HAND_MADE))  # unlabelled, no owner: delivered all the same
    c.watch_servegraph()
    with pytest.raises(RetryLater):
        await c.reconcile()
    assert "get_rayservice" not in c.api.calls and "apply_rayservice" not in c.api.calls
    assert c.api.rayservices[KEY] == HAND_MADE
    applied = next(x for x in c.body["status"]["conditions"] if x["type"] == "Applied")
    assert (applied["status"], applied["reason"]) == ("False", "Conflict")
    assert "written by kubectl-create)" in applied["message"]


async def test_a_rayservice_deleted_by_hand_is_created_again_unread() -> None:
    c = watched()
    await c.started()
    c.watch_rayservice(deleted=True)
    c.body["metadata"]["generation"] = 2
    c.watch_servegraph()
    await c.reconcile()
    assert "get_rayservice" not in c.api.calls and c.api.calls.count("apply_rayservice") == 1
    assert KEY in c.api.rayservices


async def test_after_a_refused_create_the_rayservice_is_read_not_taken_as_absent() -> None:
    """A create the API server refused (made meanwhile, not yet delivered): read the next time."""
    c = watched()
    c.api.failures["apply_rayservice"] = KubeError("Conflict", "Apply failed with conflicts", 409)
    c.watch_servegraph()
    with pytest.raises(RetryLater):
        await c.reconcile()
    assert "get_rayservice" not in c.api.calls
    del c.api.failures["apply_rayservice"]
    c.api.rayservices[KEY] = copy.deepcopy(HAND_MADE)
    c.api.calls.clear()
    with pytest.raises(RetryLater):
        await c.reconcile()
    assert c.api.calls.count("get_rayservice") == 1 and "apply_rayservice" not in c.api.calls
    assert c.api.rayservices[KEY] == HAND_MADE
    assert c.condition("Applied") == ("False", "Conflict")


# -- the watch delivering back what the operator just wrote ---------------------------------------


def versioned() -> Cluster:
    c = watched()
    c.body["metadata"]["resourceVersion"] = "1"
    return c


async def drain(c: Cluster) -> list[tuple[str, str]]:
    """The keys queued, taken off the queue."""
    keys = []
    while len(c.queue):
        key = await c.queue.get()
        c.queue.done(key)
        keys.append(key)
    return keys


async def test_the_watch_delivering_back_what_a_reconcile_wrote_queues_no_reconcile() -> None:
    c = versioned()
    c.watch_servegraph()
    await drain(c)
    await c.reconcile()
    assert c.body["metadata"]["resourceVersion"] != "1", "the status write moved the version"
    c.watch_servegraph()  # our status write, delivered back
    c.watch_rayservice()  # our apply's answer, delivered back
    assert await drain(c) == [], "both versions were held already: nothing to reconcile"
    assert c.reconciler.cache.body(KEY) == {k: v for k, v in c.body.items()}, "the body held is that version"
    # A re-list (kopf lists again after a watch gap, 410 Gone) delivers both again: reconciled,
    # as every re-list was before (test_relist.py: what it no longer returns is repaired too).
    c.watch_servegraph()
    c.watch_rayservice()
    assert await drain(c) == [KEY]


async def test_a_change_delivered_after_a_write_is_reconciled() -> None:
    c = versioned()
    c.watch_servegraph()
    await c.reconcile()
    await drain(c)
    c.body["metadata"]["annotations"] = {"team": "a"}
    c.body["metadata"]["resourceVersion"] = c.api.next_version()
    c.watch_servegraph()
    rs = c.api.rayservices[KEY]
    rs["metadata"]["labels"]["team"] = "a"
    c.api.edit(rs)  # a hand edit: a new version of the RayService
    c.watch_rayservice()
    assert await drain(c) == [KEY]


async def test_a_change_that_landed_before_the_status_write_is_reconciled_when_its_version_comes_back() -> None:
    """The status write answers the object with a change made meanwhile (a new annotation, say)
    that the reconcile did not see: that version is not held, so its delivery is reconciled,
    even when the watch delivers only it (kopf hands a handler the newest of close events)."""
    c = versioned()
    c.watch_servegraph()
    await drain(c)
    real_patch = c.api.patch_servegraph_status

    async def changed_meanwhile(*args: Any) -> dict[str, Any] | None:
        c.body["metadata"]["annotations"] = {"servegraph.io/refresh": "2"}
        return await real_patch(*args)

    c.api.patch_servegraph_status = changed_meanwhile  # type: ignore[method-assign]
    await c.reconcile()
    c.watch_servegraph()
    assert await drain(c) == [KEY]
    body = c.reconciler.cache.body(KEY)
    assert body is not None and body["metadata"]["annotations"] == {"servegraph.io/refresh": "2"}


async def test_a_write_the_watch_delivered_before_its_answer_came_leaves_no_mark() -> None:
    """Delivered before the write's answer was processed, the version is reconciled then; the
    next delivery of it (a re-list) is not mistaken for the write coming back."""
    c = versioned()
    c.watch_servegraph()
    await drain(c)
    real_patch = c.api.patch_servegraph_status

    async def delivered_first(*args: Any) -> dict[str, Any] | None:
        written = await real_patch(*args)
        c.watch_servegraph()  # the watch was faster than the answer
        return written

    c.api.patch_servegraph_status = delivered_first  # type: ignore[method-assign]
    await c.reconcile()
    assert await drain(c) == [KEY], "reconciled when it came"
    c.watch_servegraph()  # a re-list
    assert await drain(c) == [KEY]


def test_an_apply_answering_the_version_held_expects_no_delivery_of_it() -> None:
    cache = WatchCache()
    where = (NS, NAME)
    cache.put_rayservice(where, Live(None, {}, resource_version="5"))
    cache.put_applied(where, Live(None, {}, resource_version="5"))  # changed nothing: no new event comes
    assert not cache.echo_rayservice(where, "5"), "a re-list's delivery of it is reconciled"
    cache.put_applied(where, Live(None, {}, resource_version="6"))
    assert cache.echo_rayservice(where, "6")
    assert not cache.echo_rayservice(where, "6"), "consumed by the first delivery"
