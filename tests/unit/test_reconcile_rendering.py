"""The render step: rendered once per change of what it reads, on the event loop unless the graph is big."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest
from reconcile_support import KEY, Cluster

from servegraph.operator.apply import rendering
from servegraph.render import RayServiceOptions, render_rayservice


def count_renders(monkeypatch: pytest.MonkeyPatch) -> list[tuple[RayServiceOptions, str]]:
    """Every render from now on: its options and the thread it ran on."""
    renders: list[tuple[RayServiceOptions, str]] = []

    def counted(graph: Any, options: RayServiceOptions) -> dict[str, Any]:
        renders.append((options, threading.current_thread().name))
        return render_rayservice(graph, options)

    monkeypatch.setattr(rendering, "render_rayservice", counted)
    return renders


async def test_a_new_servegraph_renders_once_not_again_when_the_watch_delivers_its_rayservice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    renders = count_renders(monkeypatch)
    c = Cluster()
    await c.started()  # created; then the watches deliver the ServeGraph and the RayService it created
    await c.reconcile()
    assert len(renders) == 1, "the cluster it created has the render's own worker groups: nothing to render again"
    assert renders[0][0].previous_cluster is None
    assert c.api.writes() == []
    assert c.condition("Applied") == ("True", "UpToDate")


async def test_a_running_cluster_with_other_worker_groups_is_rendered_against(monkeypatch: pytest.MonkeyPatch) -> None:
    renders = count_renders(monkeypatch)
    c = Cluster()
    await c.started()
    rs = c.api.rayservices[KEY]
    groups = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    parked = {**copy.deepcopy(groups[0]), "groupName": "old"}
    groups.insert(0, parked)  # a group of an earlier version, still in the running cluster
    c.api.edit(rs)
    c.watch_rayservice()
    await c.reconcile()
    assert len(renders) == 2
    previous = renders[1][0].previous_cluster
    assert previous is not None and [g["groupName"] for g in previous["workerGroupSpecs"]] == ["old", "cpu"]
    written = c.api.rayservices[KEY]["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert [(g["groupName"], g["replicas"]) for g in written] == [("old", 0), ("cpu", 1)], "kept in place, parked"


async def test_a_small_graph_renders_on_the_event_loop_and_a_big_one_in_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    renders = count_renders(monkeypatch)
    c = Cluster()
    await c.started()
    assert renders[-1][1] == threading.current_thread().name

    monkeypatch.setattr(rendering, "INLINE_NODES", 1)  # mini's two nodes are now "big"
    c.body["metadata"]["generation"] = 2
    c.watch_servegraph()
    await c.reconcile()
    assert len(renders) == 2 and renders[-1][1] != threading.current_thread().name
    assert c.condition("Applied") == ("True", "UpToDate")
