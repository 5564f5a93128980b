"""The operator bench's tenant graphs (bench/tenant_graphs.py): spread like real graphs, valid,
and the same for a seed whatever the run's size, so runs compare like for like."""

from __future__ import annotations

import statistics

from bench_modules import load

from servegraph.graph import parse_graph
from servegraph.operator.apply.objectsize import manifest_bytes
from servegraph.render import RayServiceOptions, render_rayservice

tg = load("tenant_graphs")
SEED = 1


def test_sizes_spread_over_5_to_200_nodes_mostly_small() -> None:
    shapes = tg.shapes(SEED, 1000)
    nodes = [s.nodes for s in shapes]
    assert min(nodes) >= 5 and max(nodes) <= 200
    assert min(nodes) <= 6 and max(nodes) >= 180  # both ends are reached
    assert 20 <= statistics.median(nodes) <= 50
    assert sum(n <= 10 for n in nodes) >= 150  # many small graphs ...
    assert sum(n >= 100 for n in nodes) >= 80  # ... and a tail of large ones


def test_some_gpu_some_autoscaled_several_applications() -> None:
    shapes = tg.shapes(SEED, 1000)
    assert 180 <= sum(s.gpu for s in shapes) <= 320
    assert 330 <= sum(s.autoscaled for s in shapes) <= 470
    by_apps = {a: sum(s.apps == a for s in shapes) for a in range(1, 5)}
    assert all(by_apps[a] >= 30 for a in by_apps), by_apps
    assert by_apps[1] > by_apps[2] > by_apps[3] > by_apps[4]
    assert all(s.apps <= max(1, s.nodes // 3) for s in shapes)


def test_deterministic_per_seed_and_independent_of_the_count() -> None:
    assert tg.shapes(SEED, 100) == tg.shapes(SEED, 1000)[:100]
    assert tg.graph_bytes(SEED, 7) == tg.graph_bytes(SEED, 7)
    assert tg.graph_bytes(SEED, 7) != tg.graph_bytes(SEED + 1, 7)
    assert tg.shapes(SEED, 50) != tg.shapes(SEED + 1, 50)
    assert len({tg.graph_bytes(SEED, i) for i in range(200)}) == 200  # no cache hit between tenants


def test_graphs_are_valid_and_have_their_shape() -> None:
    shapes = tg.shapes(SEED, 300)
    sample = sorted(shapes, key=lambda s: s.nodes)
    sample = sample[:10] + sample[-10:] + [s for s in shapes if s.gpu][:10] + [s for s in shapes if s.autoscaled][:10]
    autoscaling = 0
    for s in sample:
        graph = parse_graph(tg.graph_bytes(SEED, s.index))
        assert graph.node_count == s.nodes and len(graph.applications) == s.apps
        nodes = [n for app in graph.applications for n in app.nodes.values()]
        assert any(n.resources.num_gpus for n in nodes) == s.gpu
        if not s.autoscaled:
            assert all(n.autoscaling is None for n in nodes)
        elif any(n.autoscaling is not None for n in nodes):
            autoscaling += 1
        manifest = render_rayservice(graph, RayServiceOptions(name=f"sg-{s.index}", namespace="ns"))
        assert manifest_bytes(manifest) < 1024 * 1024  # the API server stores it
    assert autoscaling >= 10  # each node of an autoscaled graph autoscales by a coin toss


def test_a_new_version_changes_one_user_config_and_the_version() -> None:
    biggest = max(tg.shapes(SEED, 100), key=lambda s: s.nodes)
    v1 = parse_graph(tg.graph_bytes(SEED, biggest.index))
    v2 = parse_graph(tg.graph_bytes(SEED, biggest.index, 2))
    assert (v1.version, v2.version) == ("1", "2")
    changed = [
        (a.name, node_id)
        for a, b in zip(v1.applications, v2.applications, strict=True)
        for node_id in a.nodes
        if a.nodes[node_id] != b.nodes[node_id]
    ]
    assert changed == [("app0", "n0")]
    assert (v2.applications[0].nodes["n0"].user_config or {})["revision"] == 2
    options = RayServiceOptions(name="sg", namespace="ns")
    assert render_rayservice(v1, options) != render_rayservice(v2, options)


def test_storm_picks_a_tenth_deterministically() -> None:
    picks = tg.storm(SEED, 1000, 0.1)
    assert len(picks) == 100 == len(set(picks))
    assert picks == sorted(picks) and all(0 <= i < 1000 for i in picks)
    assert picks == tg.storm(SEED, 1000, 0.1)
    assert tg.storm(SEED, 5, 0.1) != [] and tg.storm(SEED, 100, 0) == []
