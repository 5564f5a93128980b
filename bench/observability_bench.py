"""Added latency per router hop of servegraph's telemetry: per-edge metrics and header
forwarding on versus off, on a real local Ray Serve, through its HTTP proxy.

Two applications of the same graph run side by side — a chain of DEPTH sequence routers
ending in `servegraph.examples:Echo` — one with telemetry on (metrics recorded on every
edge, `x-request-id` and `x-tenant` forwarded, requests carrying those and a W3C trace
context), one off (`disable_metrics`, nothing listed, requests without those headers).
Requests alternate between the two, one in flight, so drift on a shared machine hits
both alike. Each request makes DEPTH+1 recorded hops: the HTTP hop into the ingress
router and DEPTH router → child calls; the added latency per hop is the difference of
the medians over DEPTH+1.

Usage: python bench/observability_bench.py [--depth 4] [--requests 2000] [--rounds 3]
Prints a Markdown table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import platform
import socket
import statistics
import time
from typing import Any

import aiohttp

HEADERS_ON = {
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "tracestate": "vendor=1",
    "x-request-id": "r-1",
    "x-tenant": "t-1",
}


def args_for(depth: int, on: bool) -> dict[str, Any]:
    """The rendered args of a chain r0 → r1 → ... → r{depth-1} → leaf."""
    from servegraph.dag.args import encode
    from servegraph.graph.validate import to_model
    from servegraph.v1 import graph_pb2

    g = graph_pb2.Graph(name="bench", version="1", schema_version=1)
    app = g.applications.add(name="chain", route_prefix="/chain", ingress="r0")
    app.nodes["leaf"].deployment.import_path = "servegraph.examples:Echo"
    for i in range(depth):
        node = app.nodes[f"r{i}"]
        node.sequence.steps.add(id=f"r{i + 1}" if i + 1 < depth else "leaf")
    if on:
        app.telemetry.forward_headers.extend(["x-request-id", "x-tenant"])
    else:
        app.telemetry.disable_metrics = True
    model = to_model(g)
    return encode(model, model.applications[0])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(depth: int) -> int:
    import ray
    from ray import serve

    from servegraph.runtime import build

    # serve.run applies no Serve config (replicas keep Serve's 1 CPU each): logical CPUs for
    # the 2 x (depth+1) replicas; the machine's 2 physical cores are what they share.
    ray.init(num_cpus=4 * (depth + 1), include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    for variant in ("on", "off"):
        serve.run(build(args_for(depth, variant == "on")), name=variant, route_prefix=f"/{variant}")
    return port


async def measure(port: int, requests: int, rounds: int) -> dict[str, list[float]]:
    latencies: dict[str, list[float]] = {"on": [], "off": []}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:

        async def one(variant: str) -> float:
            headers = HEADERS_ON if variant == "on" else {}
            started = time.perf_counter()
            async with session.post(f"http://127.0.0.1:{port}/{variant}", json={"x": 1}, headers=headers) as resp:
                body = await resp.json()
            elapsed = time.perf_counter() - started
            assert resp.status == 200, body
            # The leaf got what the variant forwards: proof the "on" path did its work.
            assert set(body["headers"]) == (set(HEADERS_ON) if variant == "on" else set()), body
            return elapsed

        for _ in range(200):  # warm up: connections, replicas' first calls
            await one("on")
            await one("off")
        for r in range(rounds):
            order = ("on", "off") if r % 2 == 0 else ("off", "on")
            for _ in range(requests):
                for variant in order:
                    latencies[variant].append(await one(variant))
    return latencies


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depth", type=int, default=4, help="routers in the chain")
    parser.add_argument("--requests", type=int, default=2000, help="requests per variant per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    import ray

    port = start(args.depth)
    try:
        latencies = asyncio.run(measure(port, args.requests, args.rounds))
    finally:
        ray.shutdown()
    hops = args.depth + 1
    stats = {
        v: {
            "p50": statistics.median(ls) * 1000,
            "p90": quantile(ls, 0.9) * 1000,
            "p99": quantile(ls, 0.99) * 1000,
            "mean": statistics.fmean(ls) * 1000,
        }
        for v, ls in latencies.items()
    }
    print(f"Python {platform.python_version()}, ray {ray.__version__}, {platform.machine()}, depth {args.depth}")
    print(f"{args.requests * args.rounds} requests per variant, {hops} router hops per request\n")
    print("| telemetry | p50 ms | p90 ms | p99 ms | mean ms | p50 per hop ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for v in ("off", "on"):
        s = stats[v]
        print(f"| {v} | {s['p50']:.2f} | {s['p90']:.2f} | {s['p99']:.2f} | {s['mean']:.2f} | {s['p50'] / hops:.3f} |")
    added = (stats["on"]["p50"] - stats["off"]["p50"]) / hops
    relative = 100 * (stats["on"]["p50"] / stats["off"]["p50"] - 1)
    mean_relative = 100 * (stats["on"]["mean"] / stats["off"]["mean"] - 1)
    print(f"\nadded per router hop (p50): {added * 1000:.1f} µs = {relative:+.2f} % (mean {mean_relative:+.2f} %)")


if __name__ == "__main__":
    main()
