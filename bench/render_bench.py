"""Parse + validate + render, for graphs of 10, 1,000 and 10,000 nodes.

Each size runs in a fresh interpreter so its peak RSS is its own. Prints a
Markdown table for BENCHMARKS.md. Usage: python bench/render_bench.py [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time

SIZES = (10, 1_000, 10_000)


def make_graph(nodes: int) -> bytes:
    """A realistic shape: apps of up to 100 nodes, each node binding two later ones."""
    from servegraph.graph import encode
    from servegraph.v1 import graph_pb2

    g = graph_pb2.Graph(name="bench", version="1", schema_version=1)
    per_app = min(nodes, 100)
    for a in range(nodes // per_app):
        app = g.applications.add(name=f"app{a}", route_prefix=f"/app{a}", ingress="n0")
        for i in range(per_app):
            node = app.nodes[f"n{i}"]
            node.deployment.import_path = f"models.m{i % 7}:Model"
            for j in (2 * i + 1, 2 * i + 2):
                if j < per_app:
                    node.deployment.args.add(node=graph_pb2.NodeRef(id=f"n{j}"))
            node.deployment.kwargs["threshold"].value.number_value = 0.5
            node.resources.num_cpus = 0.5
            node.resources.num_gpus = 1 if i % 10 == 0 else 0
            if i % 3 == 0:
                node.scaling.autoscaling.min_replicas = 1
                node.scaling.autoscaling.max_replicas = 4
            else:
                node.scaling.num_replicas = 2
            node.user_config.update({"temperature": 0.7})
    return encode(g)


def run_one(nodes: int, repeat: int) -> dict[str, float]:
    from servegraph.graph import parse_graph
    from servegraph.render import RayServiceOptions, render_rayservice

    data = make_graph(nodes)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        graph = parse_graph(data)
        render_rayservice(graph, RayServiceOptions(name="bench"))
        times.append(time.perf_counter() - start)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "nodes": nodes,
        "bytes": len(data),
        "median_s": statistics.median(times),
        "max_s": max(times),
        "peak_rss_mib": rss_mib,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.repeat)))
        return 0
    print(f"machine: {platform.machine()}, {platform.processor() or 'cpu'}; python {platform.python_version()}")
    print("| nodes | protobuf bytes | median s | max s | peak RSS MiB |")
    print("|---:|---:|---:|---:|---:|")
    for n in SIZES:
        out = subprocess.run(
            [sys.executable, __file__, "--one", str(n), "--repeat", str(args.repeat)],
            check=True,
            capture_output=True,
            text=True,
        )
        r = json.loads(out.stdout)
        print(f"| {r['nodes']:,} | {r['bytes']:,} | {r['median_s']:.4f} | {r['max_s']:.4f} | {r['peak_rss_mib']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
