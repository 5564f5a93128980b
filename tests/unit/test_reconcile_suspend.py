"""Suspend, resume and restart through the reconciler on the in-memory API.

The same flows run on a real API server with the real KubeRay in
tests/integration/test_suspend_restart.py, and with Ray pods answering requests in
tests/node/test_suspend.py.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from google.protobuf import text_format
from reconcile_support import KEY, NAME, NS, Cluster
from support import SAMPLES

from servegraph.cli.rollouts import restart_refused
from servegraph.graph import load_graph
from servegraph.kube import KubeError
from servegraph.names import REFRESH_ANNOTATION, RESTARTED_AT_ANNOTATION
from servegraph.operator.conditions import parse_rfc3339
from servegraph.operator.metrics import Metrics
from servegraph.operator.queue import WorkQueue
from servegraph.operator.reconcile import Reconciler, RetryLater
from servegraph.operator.rollout.decide import STABLE_S
from servegraph.operator.rollout.store import load
from servegraph.operator.spec import owner_reference, parse_spec
from servegraph.render import RayServiceOptions, render_rayservice
from servegraph.render.upgrade import predict
from servegraph.v1 import graph_pb2

FINALIZER = "ray.io/rayservice-finalizer"
T0 = 1_800_000_000.0


def mini(version: str, positive: list[str] | None = None) -> bytes:
    g = text_format.Parse((SAMPLES / "mini.txtpb").read_text(), graph_pb2.Graph())
    g.version = version
    if positive:
        g.applications[0].nodes["sentiment"].deployment.kwargs["positive"].value.list_value.extend(positive)
    return g.SerializeToString()


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def clocked(c: Cluster) -> Clock:
    clock = Clock()
    c.reconciler.rollouts.wall = clock
    return clock


async def ready(c: Cluster, clock: Clock) -> None:
    """KubeRay runs the applied spec, every application RUNNING past the stable window."""
    c.api.kuberay_reports(NS, NAME, sentiment="RUNNING")
    for _ in range(2):
        c.watch_rayservice()
        await c.reconcile()
        c.watch_servegraph()
        clock.now += STABLE_S


def kuberay_adds_its_finalizer(c: Cluster) -> None:
    c.api.rayservices[KEY]["metadata"]["finalizers"] = [FINALIZER]
    c.api.edit(c.api.rayservices[KEY], "ray-operator")


async def serving(version: str = "1", **source: Any) -> tuple[Cluster, Clock]:
    c = Cluster(**source)
    clock = clocked(c)
    c.publish(mini(version))
    await c.started()
    kuberay_adds_its_finalizer(c)
    c.watch_rayservice()
    await ready(c, clock)
    assert c.body["status"]["rollout"]["phase"] == "Serving"
    c.api.calls.clear()
    c.api.events.clear()
    return c, clock


def set_spec(c: Cluster, **fields: Any) -> None:
    c.body["spec"].update(fields)
    c.body["metadata"]["generation"] += 1
    c.watch_servegraph()


def annotate(c: Cluster, **annotations: str) -> None:
    c.body["metadata"].setdefault("annotations", {}).update(annotations)
    c.watch_servegraph()


def conditions(c: Cluster) -> dict[str, tuple[str, str]]:
    return {x["type"]: (x["status"], x["reason"]) for x in c.body["status"]["conditions"]}


def message(c: Cluster, type_: str) -> str:
    return str(next(x["message"] for x in c.body["status"]["conditions"] if x["type"] == type_))


async def kuberay_finishes_deleting(c: Cluster) -> None:
    """KubeRay deleted the Ray clusters and removes its finalizer: the RayService goes."""
    c.watch_rayservice(deleted=True)
    await c.reconcile()


# ---- suspend -----------------------------------------------------------------------------


async def test_suspend_deletes_the_rayservice_and_keeps_the_servegraph_its_history_and_graphs() -> None:
    c, _ = await serving()
    before = c.body["status"]
    downloads = len(c.registry.requests)

    set_spec(c, suspend=True)
    assert await c.reconcile() is None, "no poll is scheduled while suspended"

    assert "deletionTimestamp" in c.api.rayservices[KEY]["metadata"], "deleted; KubeRay's finalizer holds it"
    assert c.api.writes() == ["delete_rayservice", "patch_servegraph_status", "post_event"]
    status = c.body["status"]
    assert conditions(c)["Ready"] == ("False", "Suspended")
    assert conditions(c)["Progressing"] == ("False", "Suspended")
    assert conditions(c)["Applied"] == ("True", "Suspended")
    assert "version '1' is kept" in message(c, "Ready")
    assert status["graph"] == before["graph"]
    assert status["history"] == before["history"]
    assert status["rollout"] == before["rollout"]
    assert status["rayServiceName"] == NAME and "applications" not in status
    assert c.api.events == [
        ("Normal", "Suspended", "deleted RayService mini (spec.suspend); version '1' is kept and runs again on resume")
    ]
    assert before["rollout"]["digest"] in await load(c.api, NS, NAME), "the graph stays in the store"

    # KubeRay's status updates while it deletes: no second delete, nothing written.
    c.api.calls.clear()
    c.watch_rayservice()
    await c.reconcile()
    assert c.api.writes() == []
    await kuberay_finishes_deleting(c)
    assert "is deleted" in message(c, "Applied")
    assert c.api.writes() == ["patch_servegraph_status"]
    assert KEY not in c.api.rayservices
    assert len(c.registry.requests) == downloads


async def test_nothing_is_downloaded_while_suspended() -> None:
    c, _ = await serving(pollInterval="1m")
    set_spec(c, suspend=True)
    await c.reconcile()
    downloads = len(c.registry.requests)
    c.publish(mini("2", ["fine"]))  # sets the refresh annotation, as a "graph published" event does
    await c.reconcile()
    memory = c.reconciler.cache.memory(KEY)
    memory.fetch = replace(memory.fetch, poll_due=0.0)  # a poll long overdue
    await c.reconcile()
    assert len(c.registry.requests) == downloads
    assert c.body["status"]["graph"]["version"] == "1"


async def test_resume_applies_the_same_version_from_memory_without_a_download() -> None:
    c, clock = await serving(pollInterval="1m")
    serve_config = c.api.rayservices[KEY]["spec"]["serveConfigV2"]
    history = c.body["status"]["history"]
    set_spec(c, suspend=True)
    await c.reconcile()
    await kuberay_finishes_deleting(c)
    downloads = len(c.registry.requests)

    c.api.calls.clear()
    set_spec(c, suspend=False)
    delay = await c.reconcile()
    assert delay is not None and delay > 50, "the next poll is a whole interval after the resume"
    assert len(c.registry.requests) == downloads, "resumed from the graph in memory"
    assert "apply_rayservice" in c.api.writes()
    assert c.api.rayservices[KEY]["spec"]["serveConfigV2"] == serve_config
    assert c.body["status"]["history"] == history, "a resume is no new rollout"
    assert conditions(c)["Ready"] == ("False", "WaitingForApplications")
    c.watch_rayservice()
    await ready(c, clock)
    assert conditions(c)["Ready"] == ("True", "AllApplicationsRunning")


async def test_resume_after_an_operator_restart_runs_the_kept_version() -> None:
    """Nothing in memory: the version of status.rollout runs again, and the download the
    new process makes finds the same graph, so no rollout starts."""
    c, _ = await serving()
    serve_config = c.api.rayservices[KEY]["spec"]["serveConfigV2"]
    history = c.body["status"]["history"]
    set_spec(c, suspend=True)
    await c.reconcile()
    await kuberay_finishes_deleting(c)

    c.queue = WorkQueue()
    c.reconciler = Reconciler(c.api, c.registry, Metrics(), c.queue)
    c.watch_servegraph()
    await c.reconcile()
    assert KEY not in c.api.rayservices, "a new operator does not bring a suspended cluster back"
    assert conditions(c)["Ready"] == ("False", "Suspended")

    set_spec(c, suspend=False)
    await c.reconcile()
    assert c.api.rayservices[KEY]["spec"]["serveConfigV2"] == serve_config
    assert c.body["status"]["history"] == history


async def test_a_resume_while_kuberay_still_deletes_waits_for_the_rayservice_to_go() -> None:
    c, _ = await serving()
    set_spec(c, suspend=True)
    await c.reconcile()
    c.watch_rayservice()  # deleting: KubeRay's finalizer still holds it

    c.api.calls.clear()
    set_spec(c, suspend=False)
    await c.reconcile()
    assert c.api.writes() == ["patch_servegraph_status"], "nothing written to an object being deleted"
    assert conditions(c)["Applied"] == ("Unknown", "WaitingForDeletion"), "a moment's wait, no Warning"
    assert conditions(c)["Ready"] == ("False", "RayServiceMissing")

    await kuberay_finishes_deleting(c)
    assert "deletionTimestamp" not in c.api.rayservices[KEY]["metadata"], "created again"
    assert conditions(c)["Applied"] == ("True", "UpToDate")


async def test_a_version_published_while_suspended_rolls_out_on_resume() -> None:
    c, _ = await serving()
    set_spec(c, suspend=True)
    await c.reconcile()
    await kuberay_finishes_deleting(c)
    c.publish(mini("2", ["fine"]))
    await c.reconcile()
    assert c.body["status"]["graph"]["version"] == "1"

    set_spec(c, suspend=False)
    await c.reconcile()
    assert '"fine"' in c.api.rayservices[KEY]["spec"]["serveConfigV2"]
    assert [h["version"] for h in c.body["status"]["history"]] == ["2", "1"]


async def test_a_rollout_in_progress_does_not_run_out_its_deadline_while_suspended() -> None:
    c, clock = await serving()
    set_spec(c, rollout={"progressDeadline": "10m"})
    await c.reconcile()
    c.publish(mini("2", ["fine"]))
    await c.reconcile()
    deadline = parse_rfc3339(c.body["status"]["rollout"]["deadline"])
    clock.now += 60

    set_spec(c, suspend=True)
    await c.reconcile()
    assert c.body["status"]["rollout"]["suspendedAt"]
    await kuberay_finishes_deleting(c)
    clock.now += 3600  # suspended for an hour: far past the deadline

    set_spec(c, suspend=False)
    await c.reconcile()
    rollout = c.body["status"]["rollout"]
    assert "suspendedAt" not in rollout
    assert parse_rfc3339(rollout["deadline"]) == deadline + 3600
    assert rollout["phase"] == "Progressing" and c.body["status"]["history"][0]["outcome"] == "Progressing"
    assert conditions(c)["Progressing"] == ("True", "RollingOut")


async def test_a_rayservice_changed_between_the_read_and_the_delete_is_read_again() -> None:
    c, _ = await serving()
    # KubeRay writes its status just after the operator's read: the delete's precondition fails once.
    c.api.after_read["get_rayservice"] = lambda: c.api.kuberay_reports(NS, NAME, sentiment="RUNNING")
    set_spec(c, suspend=True)
    await c.reconcile()
    assert c.api.calls.count("get_rayservice") == 2 and c.api.calls.count("delete_rayservice") == 2
    assert "deletionTimestamp" in c.api.rayservices[KEY]["metadata"]
    assert conditions(c)["Applied"] == ("True", "Suspended")


async def test_a_refused_delete_is_said_and_retried() -> None:
    c, _ = await serving()
    c.api.failures["delete_rayservice"] = KubeError("Forbidden", 'rayservices "mini" is forbidden', 403)
    set_spec(c, suspend=True)
    with pytest.raises(RetryLater):
        await c.reconcile()
    assert conditions(c)["Applied"] == ("False", "DeleteFailed")
    assert conditions(c)["Ready"] == ("False", "Suspended")
    assert ("Warning", "ApplyFailed") in [(t, r) for t, r, _ in c.api.events]
    del c.api.failures["delete_rayservice"]
    await c.reconcile()
    assert "deletionTimestamp" in c.api.rayservices[KEY]["metadata"]


async def test_suspend_never_deletes_a_rayservice_the_servegraph_does_not_own() -> None:
    c, _ = await serving()
    c.api.rayservices[KEY]["metadata"]["ownerReferences"] = []
    c.api.edit(c.api.rayservices[KEY])
    c.watch_rayservice()
    set_spec(c, suspend=True)
    with pytest.raises(RetryLater):
        await c.reconcile()
    assert "delete_rayservice" not in c.api.calls
    assert conditions(c)["Ready"] == ("False", "Conflict")


async def test_a_servegraph_created_suspended_downloads_and_runs_nothing() -> None:
    c = Cluster()
    c.body["spec"]["suspend"] = True
    c.watch_servegraph()
    await c.reconcile()
    assert c.registry.requests == [] and c.api.rayservices == {}
    assert conditions(c)["Ready"] == ("False", "Suspended")
    set_spec(c, suspend=False)
    await c.reconcile()
    assert KEY in c.api.rayservices


async def test_the_deprecated_rayservice_suspend_suspends() -> None:
    c, _ = await serving()
    set_spec(c, rayService={"suspend": True})
    await c.reconcile()
    assert conditions(c)["Ready"] == ("False", "Suspended")
    assert "deletionTimestamp" in c.api.rayservices[KEY]["metadata"]


@pytest.mark.parametrize("value", [True, False])
def test_rayservice_suspend_is_never_copied_into_the_rayservice(kuberay_crds: Path, value: bool) -> None:
    """`spec.rayService.suspend` used to be copied into the RayService's spec, a field KubeRay
    1.6's RayService does not have: the API server pruned it, so it never suspended anything,
    and the live object never matched the rendered one. (1.7's has it; servegraph does not
    render it for either.)"""
    crd = yaml.safe_load((kuberay_crds / "ray.io_rayservices.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = version["schema"]["openAPIV3Schema"]
    body = {"metadata": {"name": NAME, "uid": "uid-1"}}
    spec = parse_spec(
        {"source": {"url": "https://r/g", "tokenSecretRef": {"name": "t"}}, "rayService": {"suspend": value}}, NS
    )
    manifest = render_rayservice(
        load_graph(SAMPLES / "mini.pb"), spec.rayservice_options(NAME, NS, owner_reference(body))
    )
    assert set(manifest["spec"]) <= set(schema["properties"]["spec"]["properties"]), "a field KubeRay does not declare"
    jsonschema.Draft7Validator(schema).validate(manifest)


# ---- restart -------------------------------------------------------------------------------


def pod_annotations(c: Cluster) -> list[str | None]:
    cluster = c.api.rayservices[KEY]["spec"]["rayClusterConfig"]
    groups = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    return [
        ((g["template"].get("metadata") or {}).get("annotations") or {}).get(RESTARTED_AT_ANNOTATION) for g in groups
    ]


async def test_the_restart_annotation_reaches_every_pod_template() -> None:
    c, _ = await serving()
    assert set(pod_annotations(c)) == {None}
    annotate(c, **{RESTARTED_AT_ANNOTATION: "2026-01-02T03:04:05Z"})
    await c.reconcile()
    assert "apply_rayservice" in c.api.writes(), "metadata only, no new generation: rendered again all the same"
    assert set(pod_annotations(c)) == {"2026-01-02T03:04:05Z"}
    assert conditions(c)["Applied"] == ("True", "UpToDate")
    assert ("Normal", "NewClusterUpgrade") in [(t, r) for t, r, _ in c.api.events]

    c.api.calls.clear()
    c.watch_rayservice()
    del c.body["metadata"]["annotations"][RESTARTED_AT_ANNOTATION]  # removing it restarts nothing
    c.watch_servegraph()
    await c.reconcile()
    assert "apply_rayservice" not in c.api.calls
    assert set(pod_annotations(c)) == {"2026-01-02T03:04:05Z"}


async def test_a_restart_is_refused_where_kuberay_would_not_replace_the_cluster() -> None:
    c, _ = await serving()
    set_spec(c, rayService={"upgradeStrategy": "None"})
    await c.reconcile()
    c.watch_rayservice()
    c.api.events.clear()
    annotate(c, **{RESTARTED_AT_ANNOTATION: "2026-01-02T03:04:05Z"})
    await c.reconcile()
    assert set(pod_annotations(c)) == {None}
    assert conditions(c)["Applied"] == ("False", "RestartRefused")
    assert "upgradeStrategy None" in message(c, "Applied")
    assert ("Warning", "ApplyFailed") in [(t, r) for t, r, _ in c.api.events]

    set_spec(c, rayService={"upgradeStrategy": "NewCluster"})  # now KubeRay will build a new cluster
    await c.reconcile()
    assert set(pod_annotations(c)) == {"2026-01-02T03:04:05Z"}
    assert conditions(c)["Applied"] == ("True", "UpToDate")


async def test_a_restart_value_that_is_not_a_time_is_refused_by_name() -> None:
    c, _ = await serving()
    annotate(c, **{RESTARTED_AT_ANNOTATION: "x" * 500})
    await c.reconcile()
    assert set(pod_annotations(c)) == {None}
    assert conditions(c)["Applied"] == ("False", "RestartRefused")
    assert "500 characters long" in message(c, "Applied")


async def test_a_resumed_cluster_carries_the_restart_annotation() -> None:
    c, _ = await serving()
    set_spec(c, suspend=True)
    await c.reconcile()
    await kuberay_finishes_deleting(c)
    annotate(c, **{RESTARTED_AT_ANNOTATION: "2026-01-02T03:04:05Z"}, **{REFRESH_ANNOTATION: "x"})
    set_spec(c, suspend=False, rayService={"upgradeStrategy": "None"})
    await c.reconcile()
    assert set(pod_annotations(c)) == {"2026-01-02T03:04:05Z"}, "a new cluster anyway: nothing refused"
    assert conditions(c)["Applied"] == ("True", "UpToDate")


@pytest.mark.parametrize(("strategy", "kind"), [(None, "NewCluster"), ("None", "ClusterChangeNotApplied")])
def test_a_restart_is_a_new_cluster_that_starts_clean(strategy: str | None, kind: str) -> None:
    """KubeRay hashes the pod templates with their annotations: a new value is a new cluster.
    A worker group parked at zero (kept so that a graph change stays in place) is not carried
    into it."""
    graph = load_graph(SAMPLES / "mini.pb")
    options = RayServiceOptions(name=NAME, namespace=NS, upgrade_strategy=strategy)
    running = render_rayservice(graph, options)
    cluster = running["spec"]["rayClusterConfig"]
    parked = {**cluster["workerGroupSpecs"][0], "groupName": "gpu-old"}
    cluster["workerGroupSpecs"] = [*cluster["workerGroupSpecs"], parked]

    same = render_rayservice(graph, replace(options, previous_cluster=cluster))
    assert [g["groupName"] for g in same["spec"]["rayClusterConfig"]["workerGroupSpecs"]] == ["cpu", "gpu-old"]
    restarted = render_rayservice(
        graph, replace(options, previous_cluster=cluster, restarted_at="2026-01-02T03:04:05Z")
    )
    assert [g["groupName"] for g in restarted["spec"]["rayClusterConfig"]["workerGroupSpecs"]] == ["cpu"]
    assert predict(running, restarted, applications=False).kind == kind
    assert predict(running, same, applications=False).kind == "NoChange"


@pytest.mark.parametrize(
    ("spec", "refused"),
    [
        ({}, None),
        ({"rayService": {"upgradeStrategy": "NewCluster"}}, None),
        ({"rayService": {"upgradeStrategy": "None"}}, "upgradeStrategy is None"),
        ({"suspend": True}, "it is suspended"),
        ({"rayService": {"suspend": True}}, "it is suspended"),
    ],
)
def test_servegraph_restart_refuses_what_would_restart_nothing(spec: dict[str, Any], refused: str | None) -> None:
    why = restart_refused(spec)
    assert (why is None) if refused is None else (why is not None and refused in why)
