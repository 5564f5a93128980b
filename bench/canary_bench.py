"""A graph with a canary at 50 % against the same graph without one, on one local Ray 2.60 Serve.

Issue 46's goal for the canary's cost, measured side by side in one run through Serve's HTTP
proxy: the graph is front = sequence(guard, pick), pick = switch on the payload's `model`
(`a` → echo-a, else echo-b), every request taking echo-b. Two applications:

- without: version 1 alone, as `servegraph up` deploys it (ready for a canary);
- canary at 50 %: the same version 1 as the base, with version 2 (echo-b tagged `b2`, one
  changed leaf) beside it at weight 50, laid out by `render/canary.py`: echo-b's copy in a
  side application, front choosing the version per request, the switch's choice made in front
  and the chosen echo-b redirected to the copy half of the time (no extra replica hop);
- canary at 0 %: the same layout at weight 0, every request on version 1: the canary's
  machinery without the second replica of echo-b (so the two canary rows part what the routes
  cost from what spreading the requests over two versions' replicas costs);
- without, again: a second copy of the first application, measured as one more variant: the
  run's own noise (an A/A comparison), against which the canary's difference is read;
- without, echo-b on 2 replicas: no canary, but as many processes serving echo-b as the
  canary at 50 % has (its replica and its copy's), the requests spread over them by Serve:
  what running a second replica of the changed node costs on this machine, with no canary.

Before Ray starts, the ingress router's own work per request is also measured in process
(children answering at once): what the canary adds to a replica's CPU, Serve and the network
apart.

Each answer is checked (its tag says which version served it; the canary's share is printed).
Requests/s and latency at concurrency 1 and 8, the variants taking turns round by round; every
replica keeps Serve's default `max_ongoing_requests` (5), alike in both. Goals: ≥ 0.98 of the
requests/s without a canary, ≤ +1 ms p50. The driver shares the machine's cores with Ray; its
client work is the same for both variants.

Usage: python bench/canary_bench.py [--requests 400] [--rounds 4] [--concurrency 1 8].
Prints Markdown tables for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import socket
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

BASELINE = "without a canary"
SPREAD = "without, echo-b on 2 replicas"
VARIANTS = {
    BASELINE: "plain",
    "without, again (A/A)": "plain2",
    "canary at 0 %": "canary0",
    "canary at 50 %": "canary",
    SPREAD: "plain2r",
}
GOALS = ("canary at 50 %",)
PAYLOAD = {"text": "a fine day", "model": "b"}


def graph_config(app_name: str, tag: str, echo_b_replicas: int = 1) -> dict[str, Any]:
    """One application's rendered Serve config (ready for a canary), version = the tag's digit."""
    from servegraph.graph.validate import to_model
    from servegraph.render.canary import ready
    from servegraph.render.serve_config import render_serve_config
    from servegraph.v1 import graph_pb2

    g = graph_pb2.Graph(name="bench", version=tag[-1], schema_version=1)
    app = g.applications.add(name=app_name, route_prefix=f"/{app_name}", ingress="front")
    app.nodes["front"].sequence.steps.add(id="guard")
    app.nodes["front"].sequence.steps.add(id="pick")
    pick = app.nodes["pick"].switch
    pick.field = "model"
    pick.cases.add(equals="a").node.id = "echo-a"
    pick.default.id = "echo-b"
    app.nodes["guard"].deployment.import_path = "servegraph.examples:Guard"
    for node, value in (("echo-a", "a"), ("echo-b", tag)):
        app.nodes[node].deployment.import_path = "servegraph.examples:Echo"
        app.nodes[node].deployment.args.add().value.string_value = value
    for node in app.nodes.values():
        node.resources.num_cpus = 0.1
    if echo_b_replicas > 1:
        app.nodes["echo-b"].scaling.num_replicas = echo_b_replicas
    return ready(render_serve_config(to_model(g)))


def config(http_port: int) -> dict[str, Any]:
    from servegraph.render.canary import Split, layout

    plain = graph_config("plain", "b1")
    again = graph_config("plain2", "b1")
    spread = graph_config("plain2r", "b1", echo_b_replicas=2)
    idle = layout(graph_config("canary0", "b1"), None, graph_config("canary0", "b2"), Split(weight=0))
    canary = layout(graph_config("canary", "b1"), None, graph_config("canary", "b2"), Split(weight=50))
    return {
        "http_options": {"host": "127.0.0.1", "port": http_port},
        "applications": plain["applications"]
        + canary["applications"]
        + idle["applications"]
        + again["applications"]
        + spread["applications"],
    }


class _Handle:
    """An in-process DeploymentHandle: `.options()`, `.remote()` answering at once."""

    def __init__(self, target: Any, method: str = "__call__") -> None:
        self.target, self.method = target, method

    def options(self, *, method_name: str = "__call__", stream: bool = False) -> _Handle:
        return _Handle(self.target, method_name)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        future = asyncio.get_running_loop().create_future()
        fn = self.target if self.method == "__call__" else getattr(self.target, self.method)
        future.set_result(fn(*args, **kwargs))
        return future


class _Leaf:
    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __call__(self, payload: Any, headers: Any = None) -> dict[str, str]:
        return {"node": self.tag}


async def router_work(requests: int) -> dict[str, float]:
    """µs of the ingress router's own work per request (children answering at once, in
    process): what the canary adds to a replica's CPU, apart from Serve and the network."""
    from servegraph.dag.args import Route, encode_settings
    from servegraph.dag.model import Call, Telemetry
    from servegraph.runtime.calls import Child
    from servegraph.runtime.choice import SwitchChoice
    from servegraph.runtime.routers import SequenceRouter
    from servegraph.runtime.side import as_copy
    from servegraph.runtime.telemetry import GraphContext

    def front(weight: int | None) -> SequenceRouter:
        pick = SwitchChoice.of(
            [("a", Child("echo-a", _Handle(_Leaf("a")), False))],
            Child("echo-b", _Handle(_Leaf("b1")), False),
            "model",
            None,
        )
        steps = [
            Child("guard", _Handle(lambda p: p), False),
            Child("pick", _Handle(None), True, Call(), False, False, pick),
        ]
        router = SequenceRouter("front", steps, context=GraphContext("bench", "1", Telemetry(metrics=False)))
        router.routing._make = lambda node, app: _Handle(as_copy(_Leaf, False)("b2"))
        if weight is not None:
            route = Route("2", "canary~000000000000", frozenset({"echo-b"}), weight)
            router.reconfigure(
                encode_settings({"servegraph": {"graph": {"name": "bench", "version": "1"}}}, None, route)
            )
        return router

    routers = {BASELINE: front(None), "canary at 0 %": front(0), "canary at 50 %": front(50)}
    spent = dict.fromkeys(routers, 0.0)
    for r in range(6):
        for name, router in sorted(routers.items(), reverse=r % 2 == 1):
            started = time.perf_counter()
            for _ in range(requests):
                headers = router._admit("http", PAYLOAD, {"content-type": "application/json"})
                await router.route(PAYLOAD, headers)
            spent[name] += time.perf_counter() - started
    return {name: seconds / (6 * requests) * 1e6 for name, seconds in spent.items()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start() -> int:
    """Ray, Serve, and both variants deployed from one config; Serve's HTTP port."""
    import ray
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ServeDeploySchema

    ray.init(num_cpus=8, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    client = _get_global_client()
    client.deploy_apps(ServeDeploySchema.model_validate(config(port)), _blocking=True)
    return port


async def load(
    call: Callable[[], Awaitable[str]], requests: int, concurrency: int
) -> tuple[float, list[float], Counter[str]]:
    """`requests` calls by `concurrency` workers: (elapsed seconds, latencies, who answered)."""
    latencies: list[float] = []
    served: Counter[str] = Counter()
    left = requests

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            started = time.perf_counter()
            served[await call()] += 1
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started, latencies, served


async def measure(
    port: int, args: argparse.Namespace
) -> dict[tuple[str, int], tuple[float, list[float], Counter[str]]]:
    results: dict[tuple[str, int], tuple[float, list[float], Counter[str]]] = {}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60), connector=connector) as session:

        def caller(app: str) -> Callable[[], Awaitable[str]]:
            url = f"http://127.0.0.1:{port}/{app}"

            async def call() -> str:
                async with session.post(url, json=PAYLOAD) as resp:
                    body = await resp.json()
                assert resp.status == 200 and body["payload"] == PAYLOAD, body
                return str(body["node"])

            return call

        calls = {name: caller(app) for name, app in VARIANTS.items()}
        for call in calls.values():  # warm up: connections, handles, the side application's
            await load(call, 200, 8)
        for concurrency in args.concurrency:
            spent = dict.fromkeys(calls, 0.0)
            latencies: dict[str, list[float]] = {n: [] for n in calls}
            served: dict[str, Counter[str]] = {n: Counter() for n in calls}
            for r in range(args.rounds):
                for name in sorted(calls, reverse=r % 2 == 1):
                    elapsed, measured, who = await load(calls[name], args.requests, concurrency)
                    spent[name] += elapsed
                    latencies[name].extend(measured)
                    served[name].update(who)
            for name in calls:
                results[(name, concurrency)] = (len(latencies[name]) / spent[name], latencies[name], served[name])
    return results


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=400, help="requests per variant per round")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per variant and concurrency")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8], help="concurrencies")
    parser.add_argument("--work-requests", type=int, default=20000, help="in-process requests per variant per round")
    args = parser.parse_args()

    import ray
    from ray import serve

    load_before = os.getloadavg()
    work = asyncio.run(router_work(args.work_requests))
    try:
        port = start()
        results = asyncio.run(measure(port, args))
    finally:
        if ray.is_initialized():
            serve.shutdown()  # type: ignore[no-untyped-call]
        ray.shutdown()
    load_after = os.getloadavg()

    print(
        f"\nRay {ray.__version__}, Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; "
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after"
    )
    print(
        f"front = sequence(guard, switch → echo-b), through Serve's HTTP proxy: {args.rounds} rounds x "
        f"{args.requests} requests per variant and concurrency, the variants taking turns\n"
    )
    print("| variant | concurrency | requests/s | vs without | p50 ms | Δ p50 | p99 ms | served by |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    verdicts = []
    for concurrency in args.concurrency:
        base_rate, base_lat, _ = results[(BASELINE, concurrency)]
        base_p50 = statistics.median(base_lat) * 1000
        for name in VARIANTS:
            rate, latencies, served = results[(name, concurrency)]
            p50 = statistics.median(latencies) * 1000
            p99 = quantile(latencies, 0.99) * 1000
            total = sum(served.values())
            who = ", ".join(f"{tag} {n / total:.0%}" for tag, n in sorted(served.items()))
            relative = "" if name == BASELINE else f"{rate / base_rate:.3f}"
            delta = "" if name == BASELINE else f"{p50 - base_p50:+.2f} ms"
            print(f"| {name} | {concurrency} | {rate:,.0f} | {relative} | {p50:.2f} | {delta} | {p99:.2f} | {who} |")
            if name in GOALS:
                verdicts.append(
                    f"{name}, concurrency {concurrency}: {rate / base_rate:.3f} of the requests/s "
                    f"(goal ≥ 0.98: {'met' if rate / base_rate >= 0.98 else 'missed'}), p50 {p50 - base_p50:+.2f} ms "
                    f"(goal ≤ +1 ms: {'met' if p50 - base_p50 <= 1 else 'missed'})"
                )
        spread_rate, spread_lat, _ = results[(SPREAD, concurrency)]
        rate, latencies, _ = results[(GOALS[0], concurrency)]
        verdicts.append(
            f"{GOALS[0]} against {SPREAD!r} (as many processes serving echo-b), concurrency {concurrency}: "
            f"{rate / spread_rate:.3f} of the requests/s, p50 "
            f"{(statistics.median(latencies) - statistics.median(spread_lat)) * 1000:+.2f} ms"
        )
    print()
    for line in verdicts:
        print(line)
    print("\nThe ingress router's own work per request, in process (6 rounds, children answering at once):\n")
    print("| variant | µs per request | Δ |")
    print("|---|---:|---:|")
    for name, micros in work.items():
        delta = "" if name == BASELINE else f"{micros - work[BASELINE]:+.1f} µs"
        print(f"| {name} | {micros:.1f} | {delta} |")


if __name__ == "__main__":
    main()
