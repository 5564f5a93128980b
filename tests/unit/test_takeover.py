"""A replica that takes over from another leader: what it remembers, and what it reports and
does before its first download succeeds."""

from __future__ import annotations

import contextlib

import yaml
from reconcile_support import KEY, MINI, NAME, NS, URL, Cluster

from servegraph.operator.metrics import Metrics
from servegraph.operator.reconcile import Reconciler, RetryLater
from servegraph.v1 import graph_pb2


def running(c: Cluster) -> None:
    """KubeRay reports every application of the RayService's Serve config RUNNING."""
    config = yaml.safe_load(c.api.rayservices[KEY]["spec"]["serveConfigV2"])
    c.api.kuberay_reports(NS, NAME, **{a["name"]: "RUNNING" for a in config["applications"]})


async def serving() -> Cluster:
    c = Cluster()
    await c.started()
    running(c)
    c.watch_rayservice()
    await c.reconcile()
    c.watch_servegraph()
    assert c.condition("Ready") == ("True", "AllApplicationsRunning"), c.body["status"]["conditions"]
    return c


async def test_a_new_leader_whose_first_download_fails_reports_the_kept_graph_still_serving() -> None:
    c = await serving()
    config = c.api.rayservices[KEY]["spec"]["serveConfigV2"]
    c.reconciler = Reconciler(c.api, c.registry, Metrics(), c.queue)  # a new leader: nothing in memory
    c.watch_rayservice()
    c.watch_servegraph()
    del c.registry.graphs[URL]
    c.api.calls.clear()
    with contextlib.suppress(RetryLater):
        await c.reconcile()
    assert c.condition("Fetched") == ("False", "NotFound")
    assert c.condition("Applied") == ("True", "UpToDate"), "the kept graph is what runs: it was not said to"
    assert c.condition("Ready") == ("True", "AllApplicationsRunning")
    assert c.api.rayservices[KEY]["spec"]["serveConfigV2"] == config
    assert "apply_rayservice" not in c.api.calls, "nothing changed: nothing written"
    assert c.api.calls.count("get_configmap") == 1, "one plan reads the rollback store once"


async def test_a_failing_download_does_not_stop_the_running_version_being_judged() -> None:
    c = Cluster()
    await c.started()
    c.registry.graphs[URL] = b"not a graph any more"
    c.publish(c.registry.graphs[URL])  # a publish event for a version that will not parse
    c.registry.graphs.clear()  # and the registry down by the time it is downloaded
    running(c)
    c.watch_rayservice()
    with contextlib.suppress(RetryLater):
        await c.reconcile()
    assert c.condition("Fetched") == ("False", "NotFound")
    assert c.condition("Ready") == ("True", "AllApplicationsRunning"), (
        "KubeRay's report was not read while the registry failed"
    )
    assert c.body["status"]["rollout"]["version"] == "1"


def mini(version: str) -> bytes:
    """The mini graph at `version`, its tokenizer's kwargs changed with it (a change that renders)."""
    g = graph_pb2.Graph.FromString(MINI)
    g.version = version
    kwargs = g.applications[0].nodes["tokenizer"].deployment.kwargs
    kwargs["lowercase"].value.bool_value = version == "1"
    return g.SerializeToString()


async def test_a_leader_back_after_another_led_applies_nothing_it_remembers() -> None:
    """Replica A leads and applies version 1; B leads meanwhile and applies version 2 (a poll);
    A leads again: it reconciles from what the API server holds, not rolls back to 1."""
    c = Cluster(pollInterval="1h")
    await c.started()
    a = c.reconciler
    a.queue.discard(KEY)
    c.registry.graphs[URL] = mini("2")
    c.reconciler = Reconciler(c.api, c.registry, Metrics(), c.queue)  # B, while A stands by
    c.watch_servegraph()
    c.watch_rayservice()
    await c.reconcile()
    assert c.body["status"]["rollout"]["version"] == "2"
    config = c.api.rayservices[KEY]["spec"]["serveConfigV2"]
    c.reconciler = a  # A's watches kept running: they delivered B's writes
    c.watch_servegraph()
    c.watch_rayservice()
    a.resync_all()
    c.api.calls.clear()
    await c.reconcile()
    assert c.body["status"]["rollout"]["version"] == "2", "A rolled back to the version it remembered"
    assert c.api.rayservices[KEY]["spec"]["serveConfigV2"] == config
    assert "apply_rayservice" not in c.api.calls, "the change B applied was applied again"
    assert c.api.calls.count("get_rayservice") == 1, "A reads the RayService it compared with a forgotten render, once"
