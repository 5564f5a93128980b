"""Parse + validate + render, for graphs of 10, 1,000 and 10,000 nodes; then the
upgrade prediction (render/upgrade.py:predict) between two versions of each.

Each size runs in a fresh interpreter so its peak RSS is its own. Prints
Markdown tables for BENCHMARKS.md. Usage: python bench/render_bench.py [--repeat N]
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
from typing import Any

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


def changed_version(data: bytes) -> bytes:
    """The same graph with one node's user_config changed: a Serve-only upgrade."""
    from servegraph.v1 import graph_pb2

    g = graph_pb2.Graph.FromString(data)
    g.applications[0].nodes["n1"].user_config.update({"temperature": 0.9})
    g.version = "2"
    return g.SerializeToString()


def run_predict(nodes: int, repeat: int) -> dict[str, float]:
    """CPU seconds of one prediction: as the operator makes it before an apply (create, and an
    update of one node), and with per-application changes from the Serve config structures
    (`servegraph diff`)."""
    from servegraph.graph import parse_graph
    from servegraph.render import RayServiceOptions, render_rayservice, render_serve_config
    from servegraph.render.upgrade import predict

    data = make_graph(nodes)
    old_graph, new_graph = parse_graph(data), parse_graph(changed_version(data))
    old = render_rayservice(old_graph, RayServiceOptions(name="bench"))
    previous = old["spec"]["rayClusterConfig"]
    new = render_rayservice(new_graph, RayServiceOptions(name="bench", previous_cluster=previous))
    # What the operator holds of the live RayService: its cluster spec and its Serve config text.
    live = {"spec": {"rayClusterConfig": previous, "serveConfigV2": old["spec"]["serveConfigV2"]}}
    old_config, new_config = render_serve_config(old_graph), render_serve_config(new_graph)

    def timed(call: Any) -> float:
        times = []
        for _ in range(repeat):
            start = time.process_time()
            call()
            times.append(time.process_time() - start)
        return statistics.median(times)

    return {
        "nodes": nodes,
        "serve_config_bytes": len(new["spec"]["serveConfigV2"]),
        "create_s": timed(lambda: predict(None, new, applications=False)),
        "update_s": timed(lambda: predict(live, new, applications=False)),
        "diff_s": timed(lambda: predict(old, new, old_config=old_config, new_config=new_config)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--predict", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.repeat)))
        return 0
    if args.predict:
        print(json.dumps(run_predict(args.predict, args.repeat)))
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
    print()
    print("Upgrade prediction, median CPU ms (goal at 10,000 nodes: under 50 ms)")
    print("| nodes | serveConfigV2 bytes | operator: create | operator: update | with application changes |")
    print("|---:|---:|---:|---:|---:|")
    for n in SIZES:
        out = subprocess.run(
            [sys.executable, __file__, "--predict", str(n), "--repeat", str(args.repeat)],
            check=True,
            capture_output=True,
            text=True,
        )
        r = json.loads(out.stdout)
        ms = {k: f"{r[k] * 1000:.2f}" for k in ("create_s", "update_s", "diff_s")}
        print(
            f"| {r['nodes']:,} | {r['serve_config_bytes']:,} | {ms['create_s']} | {ms['update_s']} | {ms['diff_s']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
