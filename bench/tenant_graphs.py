"""Distinct graphs for the operator bench, one per tenant, shaped like real ones (pure).

The shared 20-node graph makes every download after the first a parse and render cache
hit; a cluster's tenants each publish their own. Graph `i` of seed `s` is a function of
(s, i) alone, so a 1,000 run's graphs are the first thousand of a 10,000 run's, and two
runs with one seed compare like for like.

Sizes are log-uniform over 5-200 nodes: most graphs are small (median ~32), a few are
large. A quarter of the graphs put some nodes on GPUs, 40 % autoscale some nodes, and
bigger graphs tend to hold more applications (1-4).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

MIN_NODES = 5
MAX_NODES = 200
GPU_SHARE = 0.25
AUTOSCALED_SHARE = 0.4
MAX_APPS = 4


@dataclass(frozen=True)
class Shape:
    """What one tenant's graph looks like."""

    index: int
    nodes: int
    apps: int
    gpu: bool
    autoscaled: bool


def _rng(seed: int, index: int) -> random.Random:
    return random.Random(f"servegraph-bench:{seed}:{index}")  # str seeds hash the same on every run


def shape(seed: int, index: int) -> Shape:
    rng = _rng(seed, index)
    nodes = round(math.exp(rng.uniform(math.log(MIN_NODES), math.log(MAX_NODES))))
    nodes = min(MAX_NODES, max(MIN_NODES, nodes))
    choices = list(range(1, min(MAX_APPS, nodes // 3) + 1))  # at least 3 nodes per application
    apps = rng.choices(choices, weights=[len(choices) + 1 - c for c in choices])[0]
    return Shape(index, nodes, apps, rng.random() < GPU_SHARE, rng.random() < AUTOSCALED_SHARE)


def shapes(seed: int, count: int) -> list[Shape]:
    return [shape(seed, i) for i in range(count)]


def graph_bytes(seed: int, index: int, version: int = 1) -> bytes:
    """Tenant `index`'s graph; version 2 and later change one node's user_config (a Serve-only
    upgrade, what most publishes are) and nothing else."""
    from servegraph.graph import encode
    from servegraph.v1 import graph_pb2

    s = shape(seed, index)
    rng = _rng(seed, index)
    rng.random()  # the draws of `shape` are not reused for the contents
    g = graph_pb2.Graph(name=f"tenant-{index:05d}", version=str(version), schema_version=1)
    g.labels["team"] = f"team-{index % 37}"
    sizes = [s.nodes // s.apps + (1 if a < s.nodes % s.apps else 0) for a in range(s.apps)]
    for a, size in enumerate(sizes):
        app = g.applications.add(name=f"app{a}", route_prefix=f"/t{index}/app{a}", ingress="n0")
        for i in range(size):
            node = app.nodes[f"n{i}"]
            node.deployment.import_path = f"tenant{index}.app{a}.model{i % 7}:Model"
            node.resources.num_cpus = rng.choice((0.25, 0.5, 1.0, 2.0))
            if s.gpu and i % 4 == 1:
                node.resources.num_gpus = 1
            if s.autoscaled and rng.random() < 0.5:
                node.scaling.autoscaling.min_replicas = 1
                node.scaling.autoscaling.max_replicas = rng.randint(2, 8)
            else:
                node.scaling.num_replicas = rng.randint(1, 3)
            if rng.random() < 0.3:
                node.user_config.update({"threshold": round(rng.random(), 3)})
        for i in range(1, size):  # a random tree from the ingress: every node reachable, no cycle
            parent = app.nodes[f"n{rng.randrange(i)}"].deployment
            if rng.random() < 0.5:
                parent.args.add(node=graph_pb2.NodeRef(id=f"n{i}"))
            else:
                parent.kwargs[f"n{i}"].node.id = f"n{i}"
    if version > 1:
        g.applications[0].nodes["n0"].user_config.update({"revision": version})
    return encode(g)


def storm(seed: int, count: int, fraction: float) -> list[int]:
    """The tenants that republish at once: `fraction` of `count` (at least one), sorted."""
    if count <= 0 or fraction <= 0:
        return []
    k = min(count, max(1, round(count * fraction)))
    return sorted(random.Random(f"servegraph-bench-storm:{seed}:{count}").sample(range(count), k))
