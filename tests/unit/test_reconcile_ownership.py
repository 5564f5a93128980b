"""Ownership is decided on the object being written, and the write carries a precondition:
a RayService or rollback ConfigMap taken over by hand is refused, never overwritten, even
when the hand edit lands between the operator's check and its write."""

from __future__ import annotations

import base64
import copy
import hashlib
from typing import Any

import pytest
from reconcile_support import KEY, NAME, NS, Cluster
from support import SAMPLES

from servegraph.kube import KubeError
from servegraph.names import GRAPH_LABEL
from servegraph.operator.reconcile import RetryLater
from servegraph.operator.rollout import store

COMPLETE = (SAMPLES / "complete.pb").read_bytes()
HAND_OWNER = {"apiVersion": "v1", "kind": "ConfigMap", "name": "mine", "uid": "uid-of-mine", "controller": True}


async def retried(c: Cluster) -> None:
    """A reconcile that ends asking to be run again after a backoff."""
    with pytest.raises(RetryLater):
        await c.reconcile()


def graphs(*contents: bytes) -> dict[str, bytes]:
    return {hashlib.sha256(b).hexdigest(): b for b in contents}


def take_over(c: Cluster, obj: dict[str, Any]) -> None:
    """What a person does with kubectl edit: our label removed, the controller replaced."""
    obj["metadata"]["labels"].pop(GRAPH_LABEL, None)
    obj["metadata"]["ownerReferences"] = [dict(HAND_OWNER)]
    c.api.edit(obj)


async def test_a_rayservice_taken_over_by_hand_is_not_overwritten_by_the_next_apply() -> None:
    """The label is gone, so the watch never delivers the edit: the record kept still says "ours"."""
    c = Cluster()
    await c.started()
    take_over(c, c.api.rayservices[KEY])
    theirs = copy.deepcopy(c.api.rayservices[KEY])

    c.publish(COMPLETE)  # a new version: a write over the RayService is due
    await retried(c)
    assert c.api.rayservices[KEY] == theirs
    # The write carrying the version the operator held was refused; read, it is not ours.
    assert rayservice_calls(c) == ["apply_rayservice", "get_rayservice"]
    assert c.condition("Applied") == ("False", "Conflict")
    assert c.condition("Ready") == ("False", "Conflict")
    applied = next(x for x in c.body["status"]["conditions"] if x["type"] == "Applied")
    assert f"controlled by ConfigMap {NS}/mine, not this ServeGraph" in applied["message"]
    assert "rayServiceName" not in c.body["status"], "nothing of someone else's RayService is mirrored"

    c.watch_servegraph()  # and the next reconcile knows it without asking again
    c.api.calls.clear()
    await retried(c)
    assert c.api.calls.count("get_rayservice") == 0 and "apply_rayservice" not in c.api.calls


async def test_an_owner_changed_between_the_check_and_the_write_is_refused() -> None:
    c = Cluster()
    await c.started()
    c.publish(COMPLETE)
    c.api.kuberay_reports(NS, NAME)  # not delivered yet: the version held is stale, so the object is read
    c.api.after_read["get_rayservice"] = lambda: take_over(c, c.api.rayservices[KEY])

    await retried(c)
    rs = c.api.rayservices[KEY]
    assert rs["metadata"]["ownerReferences"] == [HAND_OWNER], "the hand edit stands"
    assert rs["spec"]["serveConfigV2"].count("- name:") == 1, "still mini's Serve config"
    # The writes carrying the version held, then the version read, were refused; read again,
    # the object is not ours.
    assert rayservice_calls(c) == ["apply_rayservice", "get_rayservice", "apply_rayservice", "get_rayservice"]
    assert c.condition("Applied") == ("False", "Conflict")


async def test_kuberays_status_write_between_the_read_and_the_write_costs_one_more_read() -> None:
    """A moved resourceVersion is not a conflict by itself: read again, still ours, written."""
    c = Cluster()
    await c.started()
    c.publish(COMPLETE)
    c.api.kuberay_reports(NS, NAME, sentiment="RUNNING")  # not delivered by the watch yet
    c.api.after_read["get_rayservice"] = lambda: c.api.kuberay_reports(NS, NAME, sentiment="RUNNING")
    await c.reconcile()
    assert c.condition("Applied") == ("True", "UpToDate")
    calls = ["apply_rayservice", "get_rayservice", "apply_rayservice", "get_rayservice", "apply_rayservice"]
    assert rayservice_calls(c) == calls
    assert c.api.rayservices[KEY]["spec"]["serveConfigV2"].count("- name:") > 1


async def test_a_drift_repair_over_our_own_rayservice_is_written_with_its_resource_version() -> None:
    """The version the watch delivered is the precondition: the write needs no read first."""
    c = Cluster()
    await c.started()
    rs = c.api.rayservices[KEY]
    rs["spec"]["serveConfigV2"] = "applications: []\n"
    c.api.edit(rs)
    c.watch_rayservice()
    written = record_applies(c)
    await c.reconcile()
    assert c.api.rayservices[KEY]["spec"]["serveConfigV2"].startswith("proxy_location:")
    assert c.api.calls == ["apply_rayservice", "post_event"]
    assert written[0]["metadata"]["resourceVersion"] == rs["metadata"]["resourceVersion"]


async def test_an_update_after_our_own_apply_is_written_on_its_answer_without_a_read() -> None:
    """What our last apply answered is the version held: a new graph costs one write, no read."""
    c = Cluster()
    c.watch_servegraph()
    await c.reconcile()  # created; the watch has not delivered the RayService yet
    version = c.api.rayservices[KEY]["metadata"]["resourceVersion"]
    c.api.calls.clear()
    written = record_applies(c)
    c.publish(COMPLETE)
    await c.reconcile()
    assert c.condition("Applied") == ("True", "UpToDate")
    assert rayservice_calls(c) == ["apply_rayservice"]
    assert written[0]["metadata"]["resourceVersion"] == version


def rayservice_calls(c: Cluster) -> list[str]:
    return [call for call in c.api.calls if call.endswith("_rayservice")]


def record_applies(c: Cluster) -> list[dict[str, Any]]:
    """Every RayService manifest applied from now on, as sent."""
    written: list[dict[str, Any]] = []
    real_apply = c.api.apply_rayservice

    async def apply(manifest: Any, force: bool = True) -> dict[str, Any]:
        written.append(copy.deepcopy(dict(manifest)))
        return await real_apply(manifest, force)

    c.api.apply_rayservice = apply  # type: ignore[method-assign]
    return written


# -- the rollback store's ConfigMap -----------------------------------------------------------------


OWNER = {"apiVersion": "servegraph.io/v1alpha1", "kind": "ServeGraph", "name": NAME, "uid": "uid-1", "controller": True}


async def test_a_store_configmap_taken_over_between_the_check_and_the_write_is_not_overwritten() -> None:
    c = Cluster()
    first = graphs(b"one")
    digest1 = next(iter(first))
    await store.keep(c.api, NS, NAME, OWNER, [digest1], first)
    where = (NS, store.store_name(NAME))

    def hand_edit() -> None:
        cm = c.api.configmap_objects[where]
        cm["metadata"]["ownerReferences"] = [dict(HAND_OWNER)]
        cm["data"] = {"settings": "theirs"}
        c.api.edit(cm)

    c.api.after_read["get_configmap"] = hand_edit
    second = graphs(b"two")
    with pytest.raises(KubeError) as info:
        await store.keep(c.api, NS, NAME, OWNER, [*second, digest1], second)
    assert info.value.status == 409
    cm = c.api.configmap_objects[where]
    assert cm["metadata"]["ownerReferences"] == [HAND_OWNER] and cm["data"] == {"settings": "theirs"}
    assert sorted(await store.load(c.api, NS, NAME)) == [digest1], "nothing of the refused write landed"


def record_store_writes(c: Cluster) -> list[tuple[str, dict[str, Any]]]:
    """Every create and patch the store sends, as sent."""
    sent: list[tuple[str, dict[str, Any]]] = []
    create, patch = c.api.create_configmap, c.api.patch_configmap

    async def recorded_create(manifest: Any) -> dict[str, Any]:
        sent.append(("create", copy.deepcopy(dict(manifest))))
        return await create(manifest)

    async def recorded_patch(namespace: str, name: str, body: Any) -> dict[str, Any]:
        sent.append(("patch", copy.deepcopy(dict(body))))
        return await patch(namespace, name, body)

    c.api.create_configmap = recorded_create  # type: ignore[method-assign]
    c.api.patch_configmap = recorded_patch  # type: ignore[method-assign]
    return sent


async def test_the_store_writes_over_its_own_configmap_with_the_version_it_read() -> None:
    c = Cluster()
    one, two = graphs(b"one"), graphs(b"two")
    await store.keep(c.api, NS, NAME, OWNER, [*one], one)
    version = c.api.configmap_objects[(NS, store.store_name(NAME))]["metadata"]["resourceVersion"]
    sent = record_store_writes(c)
    kept, _ = await store.keep(c.api, NS, NAME, OWNER, [*two, *one], two)
    assert sorted(kept) == sorted([*one, *two])
    assert sorted(await store.load(c.api, NS, NAME)) == sorted(kept)
    ((verb, body),) = sent
    assert verb == "patch" and body["metadata"]["resourceVersion"] == version
    assert list(body["binaryData"]) == list(two), "only the new graph is sent"


async def test_the_store_creates_unread_and_then_writes_only_changes_over_what_it_wrote(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = Cluster()
    one, two, three = graphs(b"one"), graphs(b"two"), graphs(b"three" * 100)
    sent = record_store_writes(c)
    kept, known = await store.keep(c.api, NS, NAME, OWNER, [*one], one, exists=False)
    assert kept == [*one] and known is not None and dict(known.sizes) == {next(iter(one)): 3}
    kept, known = await store.keep(c.api, NS, NAME, OWNER, [*two, *one], two, known=known)
    assert sorted(kept) == sorted([*one, *two])
    # A third graph the budget only fits beside the newest: the oldest is dropped by a null.
    monkeypatch.setattr(store, "BUDGET", 503)
    kept, known = await store.keep(c.api, NS, NAME, OWNER, [*three, *two, *one], three, known=known)
    assert kept == [*three, *two]
    assert "get_configmap" not in c.api.calls, "never read"
    assert [verb for verb, _ in sent] == ["create", "patch", "patch"]
    assert sent[2][1]["binaryData"] == {
        next(iter(three)): base64.b64encode(b"three" * 100).decode(),
        **dict.fromkeys(one),
    }
    assert sorted(await store.load(c.api, NS, NAME)) == sorted(kept)
    assert known is not None
    again, same = await store.keep(c.api, NS, NAME, OWNER, [*three, *two], {}, known=known)
    assert (again, same, len(sent)) == (kept, known, 3), "nothing changed: nothing written"


async def test_the_store_reads_again_when_its_configmap_changed_or_went_since_it_wrote() -> None:
    c = Cluster()
    one, two, three = graphs(b"one"), graphs(b"two"), graphs(b"three")
    where = (NS, store.store_name(NAME))
    _, known = await store.keep(c.api, NS, NAME, OWNER, [*one], one, exists=False)
    cm = c.api.configmap_objects[where]
    cm["metadata"]["labels"]["team"] = "a"  # a harmless hand edit: still ours
    c.api.edit(cm)
    kept, known = await store.keep(c.api, NS, NAME, OWNER, [*two, *one], two, known=known)
    assert sorted(kept) == sorted([*one, *two]) and c.api.calls.count("get_configmap") == 1
    assert c.api.configmap_objects[where]["metadata"]["labels"]["team"] == "a"
    del c.api.configmap_objects[where]  # deleted by hand: made again from what the store still has
    kept, known = await store.keep(c.api, NS, NAME, OWNER, [*three, *two, *one], three, known=known)
    assert kept == [*three] and sorted(await store.load(c.api, NS, NAME)) == [*three]
    # Known for another ServeGraph of the same name (deleted and made again): read first.
    reads = c.api.calls.count("get_configmap")
    other = {**OWNER, "uid": "uid-2"}
    with pytest.raises(KubeError) as info:
        await store.keep(c.api, NS, NAME, other, [*one, *three], one, known=known)
    assert info.value.status == 409 and c.api.calls.count("get_configmap") == reads + 1
    assert sorted(await store.load(c.api, NS, NAME)) == [*three], "the other ServeGraph's store stands"


async def test_a_store_taken_over_after_the_store_wrote_it_is_not_written_unread() -> None:
    c = Cluster()
    one, two = graphs(b"one"), graphs(b"two")
    where = (NS, store.store_name(NAME))
    _, known = await store.keep(c.api, NS, NAME, OWNER, [*one], one, exists=False)
    cm = c.api.configmap_objects[where]
    cm["metadata"]["ownerReferences"] = [dict(HAND_OWNER)]
    c.api.edit(cm)
    with pytest.raises(KubeError) as info:
        await store.keep(c.api, NS, NAME, OWNER, [*two, *one], two, known=known)
    assert info.value.status == 409
    assert c.api.calls.count("patch_configmap") == 1, "the one refused for its version, none after the read"
    assert sorted(await store.load(c.api, NS, NAME)) == [*one]


async def test_a_store_created_unread_over_an_existing_one_reads_it_and_drops_what_is_not_a_graph() -> None:
    c = Cluster()
    one, two = graphs(b"one"), graphs(b"two")
    where = (NS, store.store_name(NAME))
    await store.keep(c.api, NS, NAME, OWNER, [*one], one, exists=False)
    cm = c.api.configmap_objects[where]
    cm["binaryData"]["not-a-digest"] = base64.b64encode(b"x").decode()
    c.api.edit(cm)
    kept, _ = await store.keep(c.api, NS, NAME, OWNER, [*two, *one], two, exists=False)  # a status lost
    assert sorted(kept) == sorted([*one, *two])
    assert c.api.calls.count("create_configmap") == 2 and c.api.calls.count("get_configmap") == 1
    assert sorted(c.api.configmap_objects[where]["binaryData"]) == sorted(kept)
