"""Rollouts through the reconciler on the in-memory API: rollback after a restart, pins, the store."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from google.protobuf import text_format
from reconcile_support import KEY, NAME, NS, Cluster
from support import SAMPLES

from servegraph.names import ConditionType
from servegraph.operator.conditions import Condition
from servegraph.operator.metrics import Metrics
from servegraph.operator.queue import WorkQueue
from servegraph.operator.reconcile import Reconciler
from servegraph.operator.rollout import step
from servegraph.operator.rollout.decide import STABLE_S, Decision, decide
from servegraph.operator.rollout.store import load, store_name
from servegraph.operator.values import Event, Outcome
from servegraph.v1 import graph_pb2


def mini(version: str, positive: list[str] | None = None) -> bytes:
    g = text_format.Parse((SAMPLES / "mini.txtpb").read_text(), graph_pb2.Graph())
    g.version = version
    if positive:
        g.applications[0].nodes["sentiment"].deployment.kwargs["positive"].value.list_value.extend(positive)
    return g.SerializeToString()


class Clock:
    """Wall time the test moves: rollouts wait out a stable window and deadlines."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def with_clock(c: Cluster) -> Cluster:
    c.clock = Clock()  # type: ignore[attr-defined]
    c.reconciler.rollouts.wall = c.clock  # type: ignore[attr-defined]
    return c


async def ready(c: Cluster, status: str = "RUNNING") -> None:
    """KubeRay acts on the applied spec and reports the application's status, which stays
    so past the stable window (a success or a failure counts only then)."""
    c.api.kuberay_reports(NS, NAME, sentiment=status)
    for _ in range(2):
        c.watch_rayservice()
        await c.reconcile()
        c.watch_servegraph()
        c.clock.now += STABLE_S  # type: ignore[attr-defined]


def serve_config(c: Cluster) -> str:
    return str(c.api.rayservices[KEY]["spec"]["serveConfigV2"])


def restart(c: Cluster) -> None:
    """A new operator process (or a new leader): nothing in memory, the cluster as it is."""
    c.queue = WorkQueue()
    c.reconciler = Reconciler(c.api, c.registry, Metrics(), c.queue)
    c.reconciler.rollouts.wall = c.clock  # type: ignore[attr-defined]
    c.watch_servegraph()


async def v1_serving() -> Cluster:
    c = with_clock(Cluster())
    c.publish(mini("1"))
    await c.started()
    await ready(c)
    assert c.body["status"]["rollout"]["phase"] == "Serving"
    return c


async def test_a_failed_version_is_rolled_back_from_the_store_after_a_restart() -> None:
    c = await v1_serving()
    v1_config = serve_config(c)
    c.publish(mini("2", ["fine"]))
    await c.reconcile()
    assert '"fine"' in serve_config(c), "v2 applied"
    assert c.body["status"]["rollout"]["version"] == "2"

    restart(c)  # the operator dies mid-rollout; the new one knows only the cluster
    await c.reconcile()
    assert '"fine"' in serve_config(c), "the rollout goes on"
    await ready(c, "DEPLOY_FAILED")  # Ray: v2's deployment fails

    assert serve_config(c) == v1_config, "v1's RayService is applied again, from the kept graph"
    status = c.body["status"]
    assert [(h["version"], h["outcome"]) for h in status["history"]] == [
        ("1", "Progressing"),
        ("2", "RolledBack"),
        ("1", "Serving"),
    ]
    assert status["graph"]["version"] == "1"
    progressing = next(x for x in status["conditions"] if x["type"] == "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "RolledBack")
    assert ("Warning", "RolledBack") in [(t, r) for t, r, _ in c.api.events]

    await ready(c)
    restart(c)  # and again: the registry still serves v2, which is not retried
    await c.reconcile()
    assert serve_config(c) == v1_config
    assert c.body["status"]["history"][0]["outcome"] == "Serving"


async def v2_serving_after_v1() -> tuple[Cluster, str, str]:
    """Version 2 serving, version 1 kept: the cluster, v1's Serve config and its digest."""
    c = await v1_serving()
    v1_config = serve_config(c)
    c.publish(mini("2", ["fine"]))
    await c.reconcile()
    await ready(c)
    return c, v1_config, c.body["status"]["history"][1]["digest"]


async def pin(c: Cluster, digest: str) -> None:
    c.body["spec"]["rollout"] = {"pin": {"digest": f"sha256:{digest}"}}
    c.body["metadata"]["generation"] += 1
    c.watch_servegraph()
    await c.reconcile()


async def test_a_pin_applies_a_kept_version_and_unpinning_returns_to_the_source() -> None:
    c, v1_config, v1_digest = await v2_serving_after_v1()
    await pin(c, v1_digest)
    assert serve_config(c) == v1_config
    assert c.body["status"]["rollout"]["cause"] == "pin"

    del c.body["spec"]["rollout"]
    c.body["metadata"]["generation"] += 1
    c.watch_servegraph()
    await c.reconcile()
    assert '"fine"' in serve_config(c)


async def test_a_kept_graph_read_for_a_pin_is_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rollout parses a kept graph to check it still runs; the render takes that parse
    from the recently parsed graphs instead of parsing the same bytes again."""
    c, v1_config, v1_digest = await v2_serving_after_v1()
    restart(c)  # a new process: v1 is only in the store, nothing of it parsed
    await c.reconcile()
    assert c.reconciler.cache.graph(v1_digest) is None

    parses: list[int] = []
    real = c.reconciler.rollouts.parser

    async def counted(data: bytes, max_bytes: int) -> Any:
        parses.append(len(data))
        return await real(data, max_bytes)

    monkeypatch.setattr(c.reconciler.rollouts, "parser", counted)  # the render parses through it too
    await pin(c, v1_digest)
    assert serve_config(c) == v1_config
    assert len(parses) == 1, f"the kept graph was parsed {len(parses)} times"


async def test_the_store_keeps_every_version_of_the_history_and_is_owned_by_the_servegraph() -> None:
    c = await v1_serving()
    c.api.calls.clear()
    c.publish(mini("2", ["fine"]))
    await c.reconcile()
    # The publish sent the store only the new graph, over the version it wrote last, unread.
    assert "get_configmap" not in c.api.calls and c.api.calls.count("patch_configmap") == 1
    cm = c.api.configmap_objects[(NS, store_name(NAME))]
    assert cm["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    kept = await load(c.api, NS, NAME)
    assert sorted(kept) == sorted(h["digest"] for h in c.body["status"]["history"])
    assert not c.reconciler.cache.memory(KEY).unkept, "kept in the store: not written again"
    # A tampered entry is not trusted.
    cm["binaryData"] = copy.deepcopy(cm["binaryData"])
    first = next(iter(cm["binaryData"]))
    cm["binaryData"][first] = "bm90IGEgZ3JhcGg="
    assert first not in await load(c.api, NS, NAME)
    cm["binaryData"][first] = "%% not base64 %%"  # nor one that is not even base64: skipped, no exception
    assert first not in await load(c.api, NS, NAME)


async def test_a_configmap_of_the_stores_name_made_by_someone_else_is_not_taken_over() -> None:
    """The store is written only when this ServeGraph controls it: a ConfigMap someone made
    under that name stays as it is, the rollout goes on without a kept graph and says so."""
    c = with_clock(Cluster())
    where = (NS, store_name(NAME))
    theirs = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": where[1], "namespace": NS, "managedFields": [{"manager": "kubectl-create"}]},
        "data": {"settings": "theirs"},
    }
    c.api.configmap_objects[where] = copy.deepcopy(theirs)
    c.publish(mini("1"))
    await c.reconcile()
    assert c.api.configmap_objects[where] == theirs
    assert c.api.calls.count("create_configmap") == 1, "created unread: AlreadyExists"
    assert "patch_configmap" not in c.api.calls, "then read, found not ours, and left alone"
    assert ("Warning", "KeepFailed") in [(t, r) for t, r, _ in c.api.events]
    assert c.body["status"]["history"][0]["rollbackAvailable"] is False
    assert c.condition("Applied") == ("True", "UpToDate"), "the RayService is still applied"


async def test_a_rollout_in_progress_is_looked_at_again_at_its_deadline() -> None:
    c = with_clock(Cluster())
    c.publish(mini("1"))
    c.watch_servegraph()
    delay = await c.reconcile()
    assert delay is not None and 595 < delay <= 601, "the default progressDeadline is 10m"
    await ready(c)
    c.watch_servegraph()
    assert await c.reconcile() is None, "a finished rollout needs no timer"


async def test_keeping_the_graph_marks_a_new_decision_and_leaves_decides_own_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rollout step returns what it found (issue 24): the history entries `decide` made
    are not edited when the store marks what it kept."""
    decided: list[Decision] = []

    def recording(*args: Any) -> Decision:
        decided.append(decide(*args))
        return decided[-1]

    monkeypatch.setattr(step, "decide", recording)
    c = Cluster()
    await c.started()
    first = next(d for d in decided if d.history)
    assert all("rollbackAvailable" not in entry for entry in first.history)
    assert c.body["status"]["history"][0]["rollbackAvailable"] is True


def test_outcomes_chain_later_conditions_over_earlier_ones_and_keep_every_event() -> None:
    said = Condition(ConditionType.APPLIED, True, "UpToDate", "ok")
    failed = Condition(ConditionType.APPLIED, False, "ReadFailed", "no")
    fetched = Condition(ConditionType.FETCHED, True, "Downloaded", "d")
    first = Outcome(fetched=fetched, applied=said, events=(Event("Normal", "Fetched", "f"),))
    chained = first.then(Outcome(applied=failed, events=(Event("Normal", "Applied", "a"),), retry=True))
    assert (chained.fetched, chained.applied, chained.retry) == (fetched, failed, True)
    assert [e.reason for e in chained.events] == ["Fetched", "Applied"]
    assert first.then(Outcome()).applied == said and not first.then(Outcome()).retry
    assert first.applied == said and len(first.events) == 1  # neither step's own is changed
