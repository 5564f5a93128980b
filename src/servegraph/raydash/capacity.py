"""Whether a Ray cluster can hold a graph, decided before anything is deployed (pure).

Ray Serve waits for room that never comes: a graph too big for the cluster sat for
the whole `up` timeout (300 s) and then listed every replica "taken more than 30s to be
scheduled". Counting first says it at once — the graph's replicas at their start times
their resources, against the resources the cluster's live nodes declare — and
`--start-local` sizes the head it starts from the same count.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from servegraph.dag import model
from servegraph.dag.text import memory_text


@dataclass(frozen=True)
class Needs:
    """What a graph's replicas take at their start, summed, and its largest replica."""

    replicas: int = 0
    cpus: float = 0.0
    gpus: float = 0.0
    memory_bytes: float = 0.0
    custom: Mapping[str, float] = field(default_factory=dict)
    largest: tuple[str, float, float, float] = ("", 0.0, 0.0, 0.0)
    """(`app/node`, CPUs, GPUs, memory) of the replica that asks for the most CPU, GPU or memory."""


def needs(graph: model.Graph) -> Needs:
    replicas, cpus, gpus, memory = 0, 0.0, 0.0, 0.0
    custom: dict[str, float] = {}
    largest = ("", 0.0, 0.0, 0.0)
    for app in graph.applications:
        for node in app.ordered_nodes():
            r = node.resources
            _, count, _ = node.replica_range
            replicas += count
            cpus += count * r.cpus
            gpus += count * r.num_gpus
            memory += count * r.memory_bytes
            for name, amount in r.custom:
                custom[name] = custom.get(name, 0.0) + count * amount
            if count and (r.cpus, r.num_gpus, r.memory_bytes) > largest[1:]:
                largest = (f"{app.name}/{node.id}", r.cpus, r.num_gpus, float(r.memory_bytes))
    return Needs(replicas, cpus, gpus, memory, custom, largest)


def alive_resources(nodes: Iterable[Mapping[str, Any]]) -> list[Mapping[str, float]]:
    """`resources_total` of every ALIVE node in the dashboard's `GET /api/v0/nodes` answer."""
    out: list[Mapping[str, float]] = []
    for node in nodes:
        resources = node.get("resources_total")
        if node.get("state") == "ALIVE" and isinstance(resources, Mapping):
            out.append({str(k): float(v) for k, v in resources.items() if isinstance(v, int | float)})
    return out


def shortfall(want: Needs, nodes: list[Mapping[str, float]]) -> list[str]:
    """Why the cluster cannot hold the graph (nothing when it can, as far as totals tell)."""

    def total(key: str) -> float:
        return sum(n.get(key, 0.0) for n in nodes)

    short = []
    at_start = f"for its {want.replicas} replicas at their start"
    for what, need, have, shown in (
        ("CPU", want.cpus, total("CPU"), f"{want.cpus:g} CPU"),
        ("GPU", want.gpus, total("GPU"), f"{want.gpus:g} GPU"),
        ("memory", want.memory_bytes, total("memory"), f"{memory_text(want.memory_bytes)} of memory"),
    ):
        if need > have + 1e-9:
            has = memory_text(have) if what == "memory" else f"{have:g}"
            short.append(f"the graph needs {shown} {at_start}, the cluster has {has}")
    for name, need in sorted(want.custom.items()):
        if need > total(name) + 1e-9:
            short.append(f"the graph needs {need:g} of the custom resource {name!r}, the cluster has {total(name):g}")
    where, cpus, gpus, memory = want.largest
    if (
        where
        and not short
        and not any(
            n.get("CPU", 0.0) >= cpus and n.get("GPU", 0.0) >= gpus and n.get("memory", 0.0) >= memory for n in nodes
        )
    ):
        short.append(
            f"one replica of {where} needs {cpus:g} CPU, {gpus:g} GPU and {memory_text(memory)} of memory "
            "on one Ray node, and no node has that much"
        )
    return short


def local_head_flags(want: Needs, machine_cpus: int) -> list[str]:
    """`ray start` flags for a local head that holds the graph: CPUs and custom resources are
    logical to Ray, so a laptop can try a graph that asks for more than it has."""
    flags = []
    if want.cpus > machine_cpus:
        flags.append(f"--num-cpus={math.ceil(want.cpus)}")
    if want.custom:
        resources = ", ".join(f'"{k}": {math.ceil(v)}' for k, v in sorted(want.custom.items()))
        flags.append(f"--resources={{{resources}}}")
    return flags
