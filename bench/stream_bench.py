"""Streams and gRPC through servegraph against the same work without it, on one local Ray 2.60 Serve.

Issue 23's goals, measured side by side in one run through Serve's proxy:

Streams over HTTP (NDJSON, aiohttp from the driver). Three applications answer the same
request, a prompt and `max_tokens`, routed by the `x-model: b` header to generator "b":

- servegraph: a sequence whose first step is a unary deployment (`examples:Guard`) and whose
  second a switch on `x-model` between two streaming `examples:TokenGenerator`s (no delay);
- hand-written: the same chain with Ray Serve handles, as one would write it without
  servegraph: an ingress deployment awaits the guard through its handle, picks the generator
  by the header in code and streams it (`handle.options(stream=True)`) into a Starlette
  StreamingResponse of NDJSON lines;
- servegraph without the switch: the sequence with the generator as its second step. It has
  the hand-written chain's replica hops, so it splits servegraph's cost into the switch's
  extra hop (a replica every item passes through) and the routers' own work.

Time to first item: one request in flight, 16-item streams, the variants taking turns request
by request. Items/s: 8 concurrent streams of 500 items, the variants taking turns round by
round (every replica keeps Serve's default `max_ongoing_requests` of 5, alike in all three).
Goals: servegraph ≥ 0.95 of hand-written throughput, ≤ +5 ms to the first item.

gRPC vs HTTP: one unary graph (a sequence of `examples:Guard` then `examples:Tokenizer`),
called through the HTTP proxy (aiohttp) and through the gRPC proxy (servegraph's
`GraphService.Call`, grpc.aio, one channel, the `application` metadata key): requests/s
and latency at concurrency 1 and 8, the protocols taking turns round by round.

The driver shares the machine's cores with Ray: its client work is the same for every variant.

Usage: python bench/stream_bench.py [--ttfi-requests 200] [--rounds 3] [--streams 8] [--items 500]
  [--unary-requests 200]. Prints Markdown tables for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import socket
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp

PROMPT = "alpha beta gamma delta"
CHOICE = {"x-model": "b"}
STREAM_APPS = {
    "hand-written": "hand",
    "servegraph (sequence + switch)": "sg",
    "servegraph, no switch": "sg-direct",
}
UNARY_APP = "unary"
GRAPH_SERVICE = "servegraph.v1.service_pb2_grpc.add_GraphServiceServicer_to_server"


def stream_args(switch: bool) -> dict[str, Any]:
    """The rendered args of front = sequence(guard, route), route = switch(x-model) over two generators;
    without `switch`, front = sequence(guard, gen-b)."""
    from servegraph.dag.args import encode
    from servegraph.graph.validate import to_model
    from servegraph.v1 import graph_pb2

    g = graph_pb2.Graph(name="streams", version="1", schema_version=1)
    app = g.applications.add(name="streams", route_prefix="/streams", ingress="front")
    app.nodes["guard"].deployment.import_path = "servegraph.examples:Guard"
    for tag in ("a", "b"):
        gen = app.nodes[f"gen-{tag}"].deployment
        gen.import_path = "servegraph.examples:TokenGenerator"
        gen.args.add().value.string_value = tag
        gen.streaming = True
    front = app.nodes["front"].sequence
    front.steps.add(id="guard")
    if switch:
        front.steps.add(id="route")
        route = app.nodes["route"].switch
        route.header = "x-model"
        route.cases.add(equals="b").node.id = "gen-b"
        route.default.id = "gen-a"
    else:
        del app.nodes["gen-a"]
        front.steps.add(id="gen-b")
    model = to_model(g)
    return encode(model, model.applications[0])


def unary_args() -> dict[str, Any]:
    """The rendered args of steps = sequence(guard, tokenizer)."""
    from servegraph.dag.args import encode
    from servegraph.graph.validate import to_model
    from servegraph.v1 import graph_pb2

    g = graph_pb2.Graph(name="unary", version="1", schema_version=1)
    app = g.applications.add(name=UNARY_APP, route_prefix=f"/{UNARY_APP}", ingress="steps")
    app.nodes["steps"].sequence.steps.add(id="guard")
    app.nodes["steps"].sequence.steps.add(id="tokenizer")
    app.nodes["guard"].deployment.import_path = "servegraph.examples:Guard"
    app.nodes["tokenizer"].deployment.import_path = "servegraph.examples:Tokenizer"
    model = to_model(g)
    return encode(model, model.applications[0])


class HandChain:
    """The hand-written chain: guard through its handle, the generator chosen in code, streamed as NDJSON."""

    def __init__(self, guard: Any, gen_a: Any, gen_b: Any) -> None:
        self.guard = guard
        self.generators = {"a": gen_a, "b": gen_b}

    async def __call__(self, request: Any) -> Any:
        from starlette.responses import StreamingResponse

        guarded = await self.guard.remote(await request.json())
        generator = self.generators.get(request.headers.get("x-model", ""), self.generators["a"])
        items = generator.options(stream=True).remote(guarded)
        return StreamingResponse(_ndjson(items), media_type="application/x-ndjson")


async def _ndjson(items: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    async for item in items:
        yield f"{json.dumps(item)}\n".encode()


def hand_chain() -> Any:
    from ray import serve

    from servegraph.examples import Guard, TokenGenerator

    guard = serve.deployment(name="guard")(Guard).bind()
    gen_a = serve.deployment(name="gen-a")(TokenGenerator).bind("a")
    gen_b = serve.deployment(name="gen-b")(TokenGenerator).bind("b")
    return serve.deployment(name="ingress")(HandChain).bind(guard, gen_a, gen_b)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start() -> tuple[int, int]:
    """Ray, Serve with its HTTP and gRPC proxies, and the four applications; (HTTP port, gRPC port)."""
    import ray
    from ray import serve

    from servegraph.runtime import build

    # serve.run applies no Serve config (every replica keeps Serve's 1 CPU): logical CPUs for
    # the 15 replicas; the machine's cores are what they share.
    ray.init(num_cpus=24, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    http_port, grpc_port = free_port(), free_port()
    serve.start(
        http_options={"host": "127.0.0.1", "port": http_port},
        grpc_options={"port": grpc_port, "grpc_servicer_functions": [GRAPH_SERVICE]},
    )
    serve.run(hand_chain(), name="hand", route_prefix="/hand")
    serve.run(build(stream_args(switch=True)), name="sg", route_prefix="/sg")
    serve.run(build(stream_args(switch=False)), name="sg-direct", route_prefix="/sg-direct")
    serve.run(build(unary_args()), name=UNARY_APP, route_prefix=f"/{UNARY_APP}")
    return http_port, grpc_port


async def first_item(session: aiohttp.ClientSession, url: str, items: int) -> float:
    """Seconds from sending the request to the first item's line; checks the whole stream."""
    body = {"text": PROMPT, "max_tokens": items}
    started = time.perf_counter()
    async with session.post(url, json=body, headers=CHOICE) as resp:
        line = await resp.content.readline()
        elapsed = time.perf_counter() - started
        rest = await resp.read()
    assert resp.status == 200, line + rest
    assert json.loads(line) == {"model": "b", "index": 0, "token": "alpha"}, line
    assert rest.count(b"\n") == items - 1, rest[-200:]
    return elapsed


async def drain(session: aiohttp.ClientSession, url: str, items: int) -> None:
    """Reads one stream to its end, counting lines without parsing them (the client's work kept small)."""
    body = {"text": PROMPT, "max_tokens": items}
    lines = 0
    last = b""
    async with session.post(url, json=body, headers=CHOICE) as resp:
        assert resp.status == 200, await resp.text()
        async for chunk in resp.content.iter_any():
            lines += chunk.count(b"\n")
            last = chunk
    assert lines == items, (lines, last[-200:])
    assert json.loads(last.splitlines()[-1])["index"] == items - 1, last[-200:]


async def measure_streams(port: int, args: argparse.Namespace) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Per variant: the times to first item, and each round's seconds."""
    urls = {name: f"http://127.0.0.1:{port}/{app}" for name, app in STREAM_APPS.items()}
    firsts: dict[str, list[float]] = {name: [] for name in urls}
    rounds: dict[str, list[float]] = {name: [] for name in urls}
    names = list(urls)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300), connector=connector) as session:
        for name in names * 30:  # warm up: connections, replicas' first calls
            await first_item(session, urls[name], args.ttfi_items)
        await asyncio.gather(*(drain(session, urls[n], args.items) for n in names for _ in range(args.streams)))
        for i in range(args.ttfi_requests):
            order = names[i % len(names) :] + names[: i % len(names)]
            for name in order:
                firsts[name].append(await first_item(session, urls[name], args.ttfi_items))
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                started = time.perf_counter()
                await asyncio.gather(*(drain(session, urls[name], args.items) for _ in range(args.streams)))
                rounds[name].append(time.perf_counter() - started)
    return firsts, rounds


async def load(call: Callable[[], Awaitable[None]], requests: int, concurrency: int) -> tuple[float, list[float]]:
    """`requests` calls by `concurrency` workers: (elapsed seconds, each call's latency)."""
    latencies: list[float] = []
    left = requests

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            started = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started, latencies


async def measure_unary(
    http_port: int, grpc_port: int, args: argparse.Namespace
) -> dict[tuple[str, int], tuple[float, list[float]]]:
    """Per (protocol, concurrency): requests/s and the latencies, over all rounds."""
    import grpc
    from google.protobuf import json_format, struct_pb2

    from servegraph.v1 import service_pb2, service_pb2_grpc

    payload = {"text": "a good and great day"}
    expected = ["a", "good", "and", "great", "day"]
    url = f"http://127.0.0.1:{http_port}/{UNARY_APP}"
    request = service_pb2.CallRequest(payload=json_format.ParseDict(payload, struct_pb2.Value()))
    metadata = (("application", UNARY_APP),)
    results: dict[tuple[str, int], tuple[float, list[float]]] = {}
    async with (
        aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=60), connector=aiohttp.TCPConnector(limit=0)
        ) as session,
        grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel,
    ):
        stub = service_pb2_grpc.GraphServiceStub(channel)  # type: ignore[no-untyped-call]

        async def over_http() -> None:
            async with session.post(url, json=payload) as resp:
                body = await resp.json()
            assert resp.status == 200 and body == expected, body

        async def over_grpc() -> None:
            response = await stub.Call(request, metadata=metadata, timeout=60)
            assert not response.HasField("error"), response.error
            answer: Any = json_format.MessageToDict(response.result)  # a Value: here, the list of words
            assert answer == expected, response

        calls = {"HTTP": over_http, "gRPC": over_grpc}
        for call in calls.values():  # warm up
            await load(call, 100, 8)
        for concurrency in args.concurrency:
            spent = dict.fromkeys(calls, 0.0)
            latencies: dict[str, list[float]] = {p: [] for p in calls}
            for r in range(args.rounds):
                for protocol in sorted(calls, reverse=r % 2 == 1):
                    elapsed, measured = await load(calls[protocol], args.unary_requests, concurrency)
                    spent[protocol] += elapsed
                    latencies[protocol].extend(measured)
            for protocol in calls:
                results[(protocol, concurrency)] = (len(latencies[protocol]) / spent[protocol], latencies[protocol])
    return results


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ttfi-requests", type=int, default=200, help="time-to-first-item requests per variant")
    parser.add_argument("--ttfi-items", type=int, default=16, help="items per time-to-first-item stream")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds per variant (and per protocol)")
    parser.add_argument("--streams", type=int, default=8, help="concurrent streams per throughput round")
    parser.add_argument("--items", type=int, default=500, help="items per throughput stream")
    parser.add_argument("--unary-requests", type=int, default=200, help="unary requests per protocol per round")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8], help="unary concurrencies")
    args = parser.parse_args()

    import ray
    from ray import serve

    load_before = os.getloadavg()
    try:
        http_port, grpc_port = start()
        firsts, rounds = asyncio.run(measure_streams(http_port, args))
        unary = asyncio.run(measure_unary(http_port, grpc_port, args))
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
        f"Streams through Serve's HTTP proxy: time to first item over {args.ttfi_requests} requests of "
        f"{args.ttfi_items} items per variant, one in flight; items/s over {args.rounds} rounds of "
        f"{args.streams} concurrent streams x {args.items} items\n"
    )
    hand = "hand-written"
    hand_p50 = statistics.median(firsts[hand]) * 1000
    per_round = args.streams * args.items
    rates = {name: per_round * len(seconds) / sum(seconds) for name, seconds in rounds.items()}
    print(
        "| chain | first item p50 ms | first item p99 ms | Δ p50 vs hand-written "
        "| items/s | rounds' items/s min to max | vs hand-written |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in STREAM_APPS:
        p50 = statistics.median(firsts[name]) * 1000
        p99 = quantile(firsts[name], 0.99) * 1000
        delta = "" if name == hand else f"{p50 - hand_p50:+.2f} ms"
        spread = f"{per_round / max(rounds[name]):,.0f} to {per_round / min(rounds[name]):,.0f}"
        relative = "" if name == hand else f"{rates[name] / rates[hand]:.2f}"
        print(f"| {name} | {p50:.2f} | {p99:.2f} | {delta} | {rates[name]:,.0f} | {spread} | {relative} |")
    sg = "servegraph (sequence + switch)"
    ratio = rates[sg] / rates[hand]
    added = statistics.median(firsts[sg]) * 1000 - hand_p50
    print(
        f"\nservegraph / hand-written throughput {ratio:.2f} (goal ≥ 0.95: {'met' if ratio >= 0.95 else 'missed'}); "
        f"first item {added:+.2f} ms (goal ≤ +5 ms: {'met' if added <= 5 else 'missed'})"
    )

    print(
        f"\nOne unary graph (sequence: Guard, Tokenizer) through Serve's proxies: {args.rounds} rounds x "
        f"{args.unary_requests} requests per protocol and concurrency\n"
    )
    print("| protocol | concurrency | requests/s | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|")
    for (protocol, concurrency), (rate, latencies) in sorted(unary.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        p50 = statistics.median(latencies) * 1000
        p99 = quantile(latencies, 0.99) * 1000
        print(f"| {protocol} | {concurrency} | {rate:,.0f} | {p50:.2f} | {p99:.2f} |")


if __name__ == "__main__":
    main()
