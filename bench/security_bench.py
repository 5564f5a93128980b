"""Security limits (issue 14): what one hostile tenant can cost the operator.

    python bench/security_bench.py [--parts fetch,stall,render,operator] [--deadline 60]

- fetch: the worst-case time of one download under the deadline, against a registry
  that hangs, redirects slowly, answers 503 with Retry-After or trickles its body;
- stall: the longest event-loop stall while a graph is parsed, on the loop (as before),
  in a thread, and by the operator's parser (a child process, or the loop for graphs
  within its inline limits), for the largest allowed graph, two hostile ones, and three
  hostile ones at the inline limits;
- render: the longest event-loop stall while the operator renders a graph again whose parsed
  model left the recent-graphs cache (a spec patch, a new cluster), as it did before issue 45
  (re-parsed on the loop up to 32 KiB, rendered on it up to 500 nodes) and as it does now
  (`rendering.desired`: re-parsed by the operator's parser, on the loop only within its inline
  limits; rendered on the loop up to 200 nodes);
- operator: `servegraph run` on the real control plane (as operator_bench runs it) given
  the largest allowed graph: its RSS (and its parse child's) and the longest /healthz
  answer while it downloads, parses and renders it.

Prints Markdown for BENCHMARKS.md ("Security limits").
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import platform
import ssl
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from render_bench import make_graph  # noqa: E402

from servegraph import gcpause  # noqa: E402
from servegraph.cli import operate  # noqa: E402
from servegraph.graph import parse_graph  # noqa: E402
from servegraph.operator.fetch.parsing import INLINE_BYTES, INLINE_NODES, GraphParser  # noqa: E402
from servegraph.source import FetchError, FetchRequest, Limits, RegistryClient, SourcePolicy  # noqa: E402
from servegraph.v1 import graph_pb2  # noqa: E402
from servegraph_testbed.certs import write_pki  # noqa: E402
from servegraph_testbed.registry import Fault, Registry, RegistryServer  # noqa: E402

TOKEN = "bench-token"
MiB = 1024 * 1024
LOOPBACK = SourcePolicy.build(allowed_networks=["127.0.0.0/8"])


# -- graphs -----------------------------------------------------------------------------


def operator_max_bytes() -> int:
    """`servegraph run`'s default --max-graph-bytes: the largest graph the operator downloads.

    Read from its own arguments: the bench once built its largest graph from `Limits()`'s
    16 MiB after the operator's default became 4 MiB, and its operator part then waited for a
    GraphValid the refused download never gave."""
    parser = argparse.ArgumentParser()
    operate.add_arguments(parser.add_subparsers())
    return int(parser.parse_args(["run"]).max_graph_bytes)


def largest_allowed(max_bytes: int) -> bytes:
    """10,000 nodes (the node limit) padded with user_config strings to just under the size limit."""
    msg = graph_pb2.Graph.FromString(make_graph(10_000))
    nodes = [node for app in msg.applications for node in app.nodes.values()]
    pad = (max_bytes - msg.ByteSize() - 64) // len(nodes) - 16
    for node in nodes:
        node.user_config.update({"pad": "x" * pad})
    data = msg.SerializeToString()
    while len(data) > max_bytes:  # varint lengths grew: trim
        pad -= 1
        for node in nodes:
            node.user_config.update({"pad": "x" * pad})
        data = msg.SerializeToString()
    parse_graph(data, max_bytes=max_bytes)  # it is allowed
    return data


def many_labels() -> bytes:
    msg = graph_pb2.Graph.FromString((ROOT / "config" / "samples" / "mini.pb").read_bytes())
    for i in range(200_000):
        msg.labels[f"l{i}"] = "v"
    return msg.SerializeToString()


def huge_struct(max_bytes: int = Limits().max_bytes) -> bytes:
    msg = graph_pb2.Graph.FromString((ROOT / "config" / "samples" / "mini.pb").read_bytes())
    fields = next(iter(msg.applications[0].nodes.values())).user_config.fields
    i = 0
    while msg.ByteSize() < max_bytes - 64:
        for _ in range(5_000):
            fields[f"k{i}"].number_value = 1
            i += 1
    # Trim in steps: a ByteSize() per deleted field walked ~1.4 million fields each time, and
    # this ran for minutes. A field is ~20 bytes, so dropping excess/32 of them per step never
    # falls below the limit by much, and each step removes over half of what is left.
    while (excess := msg.ByteSize() - max_bytes) > 0:
        for _ in range(max(1, excess // 32)):
            i -= 1
            del fields[f"k{i}"]
    return msg.SerializeToString()


def _grown(build: Callable[[int], graph_pb2.Graph], limit: int = INLINE_BYTES) -> bytes:
    """The largest of build(1), build(2), ... whose bytes stay within `limit`, by doubling then bisecting."""
    low, high = 1, 2
    while len(build(high).SerializeToString()) <= limit:
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if len(build(mid).SerializeToString()) <= limit else (low, mid)
    return build(low).SerializeToString()


def _mini_with(nodes: int) -> tuple[graph_pb2.Graph, graph_pb2.Application]:
    msg = graph_pb2.Graph.FromString((ROOT / "config" / "samples" / "mini.pb").read_bytes())
    app = msg.applications[0]
    for i in range(nodes - len(app.nodes)):
        app.nodes[f"x{i}"].deployment.import_path = "m:C"
    return msg, app


def small_hostile() -> dict[str, bytes]:
    """Graphs at the limits of what parses on the operator's loop (`parsing.INLINE_BYTES`,
    `INLINE_NODES`), each built to cost the most per byte: every node, argument, case and
    problem is validated and reported. The loop stall they cause is the bound on inline parses."""

    def arguments(n: int) -> graph_pb2.Graph:
        msg, app = _mini_with(INLINE_NODES)
        for node in app.nodes.values():
            if node.HasField("deployment"):
                for _ in range(n):
                    node.deployment.args.add().value.null_value = 0
        return msg

    def kwargs(n: int) -> graph_pb2.Graph:
        msg, app = _mini_with(1)
        node = next(iter(app.nodes.values()))
        for i in range(n):
            node.deployment.kwargs[f"{i:x}"].node.retries = 1  # each one a problem
        return msg

    def cases(n: int) -> graph_pb2.Graph:
        msg, app = _mini_with(INLINE_NODES)
        switch = app.nodes["x0"].switch
        switch.field = "f"
        for i in range(n):
            case = switch.cases.add(equals=f"{i:x}")
            case.node.id = f"x{1 + i % (INLINE_NODES - 2)}"
        return msg

    return {
        f"{INLINE_NODES} nodes and their arguments ({INLINE_BYTES // 1024} KiB)": _grown(arguments),
        f"one node's keyword arguments, each a problem ({INLINE_BYTES // 1024} KiB)": _grown(kwargs),
        f"a switch's cases ({INLINE_BYTES // 1024} KiB)": _grown(cases),
    }


# -- fetch ------------------------------------------------------------------------------


async def bench_fetch(deadline: float) -> list[tuple[str, float, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        pki = write_pki(Path(tmp))
        server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ssl.load_cert_chain(pki.serving_cert, pki.serving_key)
        ca = pki.ca_cert.read_text()
        registry = await RegistryServer(Registry(token=TOKEN), server_ssl).start()
        reg = registry.registry
        reg.publish("trickle", b"\x00" * 100_000)
        hop = deadline / 6 * 0.95
        scenarios: dict[str, Callable[[], None]] = {
            "hangs before answering (10 min)": lambda: reg.faults.update(hang=Fault(hang_s=600)),
            "5 slow redirects, then 503": lambda: reg.faults.update(
                {f"hop{i}": Fault(hang_s=hop, redirect_to=registry.url(f"hop{i + 1}")) for i in range(5)}
                | {"hop5": Fault(hang_s=hop, status=503, times=10**6)}
            ),
            "503 with Retry-After: 5, forever": lambda: reg.faults.update(
                retry=Fault(status=503, times=10**6, retry_after="5")
            ),
            "trickles its body (stalls 10 min)": lambda: reg.faults.update(trickle=Fault(stall_body_s=600)),
        }
        names = {
            "hangs before answering (10 min)": "hang",
            "5 slow redirects, then 503": "hop0",
            "503 with Retry-After: 5, forever": "retry",
            "trickles its body (stalls 10 min)": "trickle",
        }
        results = []
        async with RegistryClient(LOOPBACK) as client:
            for what, arm in scenarios.items():
                arm()
                timeout, max_bytes = Limits(deadline_s=deadline).clamp(600.0, 268435456)  # the CRD's maximums
                request = FetchRequest(
                    registry.url(names[what]), TOKEN, timeout_s=timeout, ca_pem=ca, max_bytes=max_bytes
                )
                start = time.monotonic()
                try:
                    await client.fetch(request)
                    outcome = "downloaded"
                except FetchError as exc:
                    outcome = exc.reason
                results.append((what, time.monotonic() - start, outcome))
                print(f"  fetch: {what}: {results[-1][1]:.2f} s ({outcome})", file=sys.stderr)
        await registry.stop()
    return results


# -- stall -------------------------------------------------------------------------------


async def longest_stall(work: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """(longest gap between 5 ms ticks of the loop, seconds the work took)."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.monotonic()
        while not done.is_set():
            await asyncio.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    start = time.monotonic()
    with contextlib.suppress(Exception):  # hostile graphs are refused: that is the expected end
        await work()
    took = time.monotonic() - start
    await asyncio.sleep(0.05)
    done.set()
    await task
    return max(gaps), took


async def bench_stall(graphs: dict[str, bytes]) -> list[tuple[str, str, float, float]]:
    # The collector as the operator runs it: with CPython's defaults, a full collection over
    # this process's heap (the graphs above) landed in one row or another, ~50 ms at random.
    gcpause.tune_for_service()
    parser = GraphParser()
    await parser.start()
    rows = []
    try:
        for name, data in graphs.items():

            async def on_loop(data: bytes = data) -> None:
                parse_graph(data, max_bytes=len(data))

            async def in_thread(data: bytes = data) -> None:
                await asyncio.to_thread(parse_graph, data, max_bytes=len(data))

            async def in_child(data: bytes = data) -> None:
                await parser.parse(data, len(data))

            for how, work in (
                ("on the loop (before)", on_loop),
                ("in a thread", in_thread),
                ("the operator's parser (now)", in_child),
            ):
                stall, took = await longest_stall(work)
                rows.append((name, how, stall, took))
                print(f"  stall: {name}, {how}: longest {stall * 1000:.0f} ms over {took:.2f} s", file=sys.stderr)
    finally:
        await parser.close()
    return rows


# -- render ------------------------------------------------------------------------------------


def wide(limit: int = 32 * 1024) -> bytes:
    """A valid graph of as many nodes as `limit` bytes hold: one sequence over tiny deployments
    (~1,300 nodes in 32 KiB: what re-parsing up to 32 KiB on the loop let through)."""

    def build(n: int) -> graph_pb2.Graph:
        msg = graph_pb2.Graph(name="wide", version="1", schema_version=1)
        app = msg.applications.add(name="a", route_prefix="/a", ingress="s")
        for i in range(n):
            app.nodes[f"n{i:x}"].deployment.import_path = "m:C"
            app.nodes["s"].sequence.steps.add().id = f"n{i:x}"
        return msg

    return _grown(build, limit)


async def bench_render(graphs: dict[str, bytes]) -> list[tuple[str, str, float, float]]:
    from servegraph.operator.apply import rendering
    from servegraph.operator.cache import WatchCache
    from servegraph.operator.spec import parse_spec
    from servegraph.operator.values import GoodGraph
    from servegraph.render import render_rayservice

    gcpause.tune_for_service()
    parser = GraphParser()
    await parser.start()
    spec = parse_spec({"source": {"url": "https://r/g", "tokenSecretRef": {"name": "t"}}}, "ns")
    body = {"metadata": {"name": "g", "namespace": "ns", "uid": "u", "generation": 1}}
    rows = []
    try:
        for name, data in graphs.items():
            graph = parse_graph(data, max_bytes=len(data))
            good = GoodGraph.of(graph, name, data)
            options = spec.rayservice_options("g", "ns", {"uid": "u"})

            async def before(data: bytes = data, graph: Any = graph, options: Any = options) -> None:
                parsed = parse_graph(data, max_bytes=len(data)) if len(data) <= 32 * 1024 else graph
                if parsed.node_count <= 500:
                    render_rayservice(parsed, options)
                else:
                    await asyncio.to_thread(render_rayservice, parsed, options)

            async def now(good: GoodGraph = good) -> None:
                await rendering.desired(None, good, spec, body, None, WatchCache(), parser.parse)

            for how, work in (("before (issue 45)", before), ("now", now)):
                stall, took = await longest_stall(work)
                rows.append((name, how, stall, took))
                print(f"  render: {name}, {how}: longest {stall * 1000:.0f} ms over {took:.2f} s", file=sys.stderr)
    finally:
        await parser.close()
    return rows


# -- the operator ----------------------------------------------------------------------------


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(c) for c in text]
    return found


async def bench_operator(data: bytes) -> dict[str, float]:
    import aiohttp
    from kubernetes_asyncio import client

    from servegraph_testbed import ControlPlane, find_binaries
    from servegraph_testbed.clients import api_client
    from servegraph_testbed.processes import free_port, http_probe

    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp, ControlPlane(find_binaries(), crds=[ROOT / "config" / "crd"]) as cp:
        cp.install_crds(find_binaries().kuberay_crds)
        pki = write_pki(Path(tmp))
        server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ssl.load_cert_chain(pki.serving_cert, pki.serving_key)
        registry = await RegistryServer(Registry(token=TOKEN), server_ssl).start()
        registry.registry.publish("largest", data)
        cp.kubectl("apply", "-f", str(ROOT / "config" / "rbac" / "role.yaml"))
        cp.kubectl(
            "create", "clusterrolebinding", "bench", "--clusterrole=servegraph-operator", "--user=servegraph-operator"
        )
        port = free_port()
        argv = [sys.executable, "-m", "servegraph.cli", "run", "--health-address", f"127.0.0.1:{port}",
                "--allowed-source-networks=127.0.0.0/8", "--namespace=bench"]  # fmt: skip
        op = cp.spawn("servegraph-operator", argv, identity="servegraph-operator")
        op.wait_ready(lambda: http_probe(f"http://127.0.0.1:{port}/readyz"), timeout=60)
        assert op.pid is not None
        await asyncio.sleep(3)
        results["rss_idle_mib"] = _status_kib(op.pid, "VmRSS") / 1024
        children = _children(op.pid)
        results["child_idle_mib"] = sum(_status_kib(c, "VmRSS") for c in children) / 1024
        latencies: list[float] = []
        async with api_client(cp) as api, aiohttp.ClientSession() as session:
            core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
            await core.create_namespace({"metadata": {"name": "bench"}})
            for name, key, value in (("token", "token", TOKEN), ("ca", "ca.crt", pki.ca_cert.read_text())):
                secret = {"metadata": {"name": name}, "data": {key: base64.b64encode(value.encode()).decode()}}
                await core.create_namespaced_secret("bench", secret)
            source = {"url": registry.url("largest"), "tokenSecretRef": {"name": "token"},
                      "caBundle": {"secretRef": {"name": "ca"}}}  # fmt: skip
            body = {"apiVersion": "servegraph.io/v1alpha1", "kind": "ServeGraph", "metadata": {"name": "largest"},
                    "spec": {"source": source}}  # fmt: skip
            await custom.create_namespaced_custom_object("servegraph.io", "v1alpha1", "bench", "servegraphs", body)
            deadline = time.monotonic() + 120
            valid = None
            while time.monotonic() < deadline:
                start = time.monotonic()
                async with session.get(f"http://127.0.0.1:{port}/healthz") as resp:
                    await resp.read()
                latencies.append(time.monotonic() - start)
                sg = await custom.get_namespaced_custom_object(
                    "servegraph.io", "v1alpha1", "bench", "servegraphs", "largest"
                )
                conds = {c["type"]: c for c in (sg.get("status") or {}).get("conditions") or []}
                if "Applied" in conds and "GraphValid" in conds:
                    valid = conds
                    break
                await asyncio.sleep(0.02)
        assert valid is not None, "the operator did not finish with the largest graph"
        results["graph_valid"] = float(valid["GraphValid"]["status"] == "True")
        print(f"  operator: Applied {valid['Applied']['reason']}: {valid['Applied']['message'][:160]}", file=sys.stderr)
        results["rss_mib"] = _status_kib(op.pid, "VmRSS") / 1024
        results["peak_rss_mib"] = _status_kib(op.pid, "VmHWM") / 1024
        results["child_peak_mib"] = max((_status_kib(c, "VmHWM") for c in _children(op.pid)), default=0) / 1024
        results["healthz_max_ms"] = max(latencies) * 1000
        results["healthz_p50_ms"] = statistics.median(latencies) * 1000
        await registry.stop()
        cp.unspawn(op)
    return results


def versions() -> str:
    import aiohttp
    import google.protobuf
    import kopf
    import yarl

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    return (
        f"{cpu}, {len([1 for line in Path('/proc/cpuinfo').read_text().splitlines() if line.startswith('processor')])} "
        f"CPUs; Python {platform.python_version()}, protobuf {google.protobuf.__version__}, aiohttp {aiohttp.__version__}, "
        f"yarl {yarl.__version__}, kopf {kopf.__version__}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--parts", default="fetch,stall,render,operator")
    parser.add_argument("--deadline", type=float, default=Limits().deadline_s)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    print(f"machine: {versions()}")
    largest = largest_allowed(operator_max_bytes())
    if "fetch" in parts:
        rows = asyncio.run(bench_fetch(args.deadline))
        print(f"\n| a registry that ... (deadline {args.deadline:g} s) | one download took | ended as |")
        print("|---|---:|---|")
        for what, took, outcome in rows:
            print(f"| {what} | {took:.2f} s | {outcome} |")
    if "stall" in parts:
        graphs = {
            f"largest allowed ({len(largest) / MiB:.1f} MiB, 10,000 nodes)": largest,
            "200,000 labels (2.6 MiB)": many_labels(),
            "16 MiB user_config of tiny fields": huge_struct(),
            **small_hostile(),
        }
        stall_rows = asyncio.run(bench_stall(graphs))
        print("\n| graph | parsed | longest loop stall | parse took |")
        print("|---|---|---:|---:|")
        for name, how, stall, took in stall_rows:
            print(f"| {name} | {how} | {stall * 1000:.0f} ms | {took:.2f} s |")
    if "render" in parts:
        wide_graph = wide()
        graphs = {
            f"{parse_graph(wide_graph).node_count:,} nodes in {len(wide_graph):,} bytes": wide_graph,
            "500 nodes (render_bench's shape)": make_graph(500),
            "200 nodes (render_bench's shape)": make_graph(200),
            "the mini sample": (ROOT / "config" / "samples" / "mini.pb").read_bytes(),
        }
        render_rows = asyncio.run(bench_render(graphs))
        print("\n| graph rendered again, its model evicted | how | longest loop stall | took |")
        print("|---|---|---:|---:|")
        for name, how, stall, took in render_rows:
            print(f"| {name} | {how} | {stall * 1000:.0f} ms | {took * 1000:.0f} ms |")
    if "operator" in parts:
        r = asyncio.run(bench_operator(largest))
        print(f"\n| the operator given the largest allowed graph ({len(largest):,} bytes) | |")
        print("|---|---:|")
        print(
            f"| operator RSS idle / after / peak (VmHWM) | {r['rss_idle_mib']:.0f} / {r['rss_mib']:.0f} / {r['peak_rss_mib']:.0f} MiB |"
        )
        print(f"| parse child RSS idle / peak | {r['child_idle_mib']:.0f} / {r['child_peak_mib']:.0f} MiB |")
        print(
            f"| /healthz answer, median / longest, during it | {r['healthz_p50_ms']:.0f} / {r['healthz_max_ms']:.0f} ms |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
