"""`servegraph diff sg/NAME` at 4,800 and 10,000 nodes: reading the live RayService's
serveConfigV2 back (libyaml before, `render/serve_text.py` now), and the whole comparison
after the GET (the new graph parsed and rendered, the prediction with its per-application
changes), in-process, median of 5. Prints a Markdown table for BENCHMARKS.md.

Usage: python bench/diff_bench.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import yaml
from render_bench import make_graph

from servegraph.graph import parse_graph
from servegraph.render import RayServiceOptions, render_rayservice, render_serve_config
from servegraph.render.serve_text import read_config
from servegraph.render.upgrade import predict

REPEATS = 5


def timed(fn: Callable[[], Any]) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def one_node_changed(data: bytes) -> bytes:
    from servegraph.v1 import graph_pb2

    g = graph_pb2.Graph.FromString(data)
    g.applications[0].nodes["n1"].user_config.update({"temperature": 0.9})
    g.version = "2"
    return g.SerializeToString()


def measure(nodes: int) -> str:
    data = make_graph(nodes)
    options = RayServiceOptions(name="bench", namespace="bench")
    live = render_rayservice(parse_graph(data), options)
    text = live["spec"]["serveConfigV2"]
    assert read_config(text) == yaml.load(text, Loader=yaml.CSafeLoader)
    newer = one_node_changed(data)

    def diff_after_get() -> None:
        graph = parse_graph(newer)
        new = render_rayservice(graph, options)
        found = predict(live, new, old_config=read_config(text), new_config=render_serve_config(graph))
        assert len(found.applications) == 1

    libyaml = timed(lambda: yaml.load(text, Loader=yaml.CSafeLoader))
    fast = timed(lambda: read_config(text))
    whole = timed(diff_after_get)
    return f"| {nodes:,} | {len(text):,} | {libyaml:.2f} | {fast:.3f} | {whole:.2f} |"


def main() -> None:
    print("| nodes | serveConfigV2 chars | read back: libyaml s | read back: serve_text s | diff after the GET s |")
    print("|---:|---:|---:|---:|---:|")
    for nodes in (4_800, 10_000):
        print(measure(nodes))


if __name__ == "__main__":
    main()
