"""Parse fairness (issue 21, case 6): how long tenant B's new graph takes while tenant A
republishes the costliest graph it can on every poll, against the same with A idle.

    python bench/parse_fairness_bench.py [--parts parser,operator] [--samples 12]
    python bench/parse_fairness_bench.py --parts operator --operator-src /path/to/old/checkout

- parser: the operator's GraphParser in this process. A keeps two parses going at all
  times (its namespace's two download slots), B parses the `mini` sample (padded to 16 KiB, past
  what the operator parses on its loop) every 0.2 s;
  B's submit → parsed. "before" is one child, first come first served (what parsing.py
  did: one lock); "after" the operator's default (round robin by namespace over
  `default_workers()` children).
- operator: `servegraph run` on the real control plane (etcd + kube-apiserver, no
  KubeRay) with a graph registry over HTTPS. A has two ServeGraphs, each given a new
  costliest graph and the refresh annotation (what the events endpoint sets) every
  second; B's ServeGraph gets a new graph (its threshold changes) and the refresh
  annotation; B's publish → its RayService carries the new graph, seen by a watch.
  `--operator-src DIR` runs another checkout's operator (e.g. main before the change:
  `git archive <commit> | tar -x -C DIR`) for the comparison.

A's graph: 199,000 null `user_config` values (the limit is 200,000) and one bad route
prefix, 2.5 MB: the most parse CPU found within the default limits (about half a second
here); the validator refuses it after reading all of it, so it costs parse CPU and
nothing else. Prints Markdown for
BENCHMARKS.md, with the machine and its load average.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gc
import os
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

from servegraph.graph import GraphError, encode, parse_graph  # noqa: E402
from servegraph.operator.fetch.parsing import INLINE_BYTES, GraphParser, default_workers  # noqa: E402
from servegraph.v1 import graph_pb2  # noqa: E402

MINI = (ROOT / "config" / "samples" / "mini.pb").read_bytes()


def _past_inline(data: bytes) -> bytes:
    """`data` padded past what the operator parses on its loop (`parsing.INLINE_BYTES`): this
    bench measures how children are shared, which a graph parsed on the loop never waits for."""
    msg = graph_pb2.Graph.FromString(data)
    node = next(n for app in msg.applications for n in app.nodes.values() if n.HasField("deployment"))
    node.user_config.fields["pad"].string_value = "x" * INLINE_BYTES
    return msg.SerializeToString()


B_BASE = _past_inline(MINI)
TOKEN = "bench-token"
USER = "servegraph-operator"


# -- graphs -----------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        if not n:
            return bytes(out + bytes([low]))
        out.append(low | 0x80)


def _field(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + _varint(len(payload)) + payload


def costliest() -> bytes:
    """`mini` with one node's user_config holding 199,000 null values (the limit is 200,000)
    and a route prefix without its leading slash: every value is parsed and validated, then
    the graph is refused, so it costs parse CPU and nothing after. Built as wire bytes
    (through the Python API it takes minutes)."""
    null = _field(0x12, b"\x08\x00")  # a Struct.fields entry's value: Value{null_value: NULL_VALUE}
    entries = b"".join(_field(0x0A, _field(0x0A, f"{i:x}".encode()) + null) for i in range(199_000))
    msg = graph_pb2.Graph.FromString(MINI)
    next(iter(msg.applications[0].nodes.values())).user_config.MergeFromString(entries)
    msg.applications[0].route_prefix = "no-leading-slash"
    return msg.SerializeToString()


def another(data: bytes, n: int) -> bytes:
    """The same graph with another version (a field appended: the last one wins), so its
    digest and ETag differ and nothing is taken from a cache."""
    return data + _field(0x12, f"a-{n}".encode())


def b_graph(n: int) -> tuple[bytes, str]:
    """B's graph with a threshold unique to `n`, and the text that shows it in the Serve config."""
    msg = graph_pb2.Graph.FromString(B_BASE)
    threshold = round(0.5 + n / 10_000, 4)
    for app in msg.applications:
        for node in app.nodes.values():
            if "threshold" in node.user_config.fields:
                node.user_config.fields["threshold"].number_value = threshold
    return encode(msg), f'"threshold":{threshold}'


# -- figures ----------------------------------------------------------------------------


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median": statistics.median(ordered),
        "p90": ordered[max(0, round(0.9 * (len(ordered) - 1)))],
        "max": ordered[-1],
    }


def _ms(s: float) -> str:
    return f"{s * 1000:,.0f} ms"


# -- the parser alone -------------------------------------------------------------------


async def _a_streams(parse: Callable[[bytes, str], Awaitable[Any]], worst: bytes, streams: int) -> list[int]:
    """Start A's parses, back to back on `streams` slots; returns a counter list (parses done)."""
    done = [0]

    async def stream(k: int) -> None:
        n = 0
        while True:
            n += 1
            with contextlib.suppress(GraphError):
                await parse(another(worst, k * 1_000_000 + n), "tenant-a")
            done[0] += 1

    tasks = [asyncio.create_task(stream(k)) for k in range(streams)]
    _A_TASKS.extend(tasks)
    return done


_A_TASKS: list[asyncio.Task[None]] = []


async def _stop_a() -> None:
    for task in _A_TASKS:
        task.cancel()
    for task in _A_TASKS:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    _A_TASKS.clear()


async def bench_parser(worst: bytes, samples: int, workers: int, streams: int) -> list[dict[str, Any]]:
    rows = []
    for label, n, fair in (
        ("before: one child, first come first served", 1, False),
        ("one child, round robin by namespace", 1, True),
        (f"after: {workers} children, round robin by namespace (default here)", workers, True),
    ):
        parser = GraphParser(workers=n)
        await parser.start()

        async def parse(data: bytes, tenant: str, parser: GraphParser = parser, fair: bool = fair) -> Any:
            return await parser.parse(data, len(data), tenant=tenant if fair else "")

        async def b_latencies(parse: Callable[[bytes, str], Awaitable[Any]] = parse) -> list[float]:
            out = []
            for _ in range(samples):
                start = time.monotonic()
                await parse(B_BASE, "tenant-b")
                out.append(time.monotonic() - start)
                await asyncio.sleep(0.2)
            return out

        try:
            idle = await b_latencies()
            done = await _a_streams(parse, worst, streams)
            await asyncio.sleep(0.5)
            busy = await b_latencies()
            a_parses = done[0]
            await _stop_a()
        finally:
            await parser.close()
        row: dict[str, Any] = {"label": label, "idle": summary(idle), "busy": summary(busy), "a_parses": a_parses}
        row["ratio"] = row["busy"]["median"] / row["idle"]["median"]
        print(f"  parser: {label}: {row}", file=sys.stderr, flush=True)
        rows.append(row)
    return rows


# -- the operator on the real control plane ----------------------------------------------


def _servegraph(name: str, url: str) -> dict[str, Any]:
    source = {"url": url, "tokenSecretRef": {"name": "token"}, "caBundle": {"secretRef": {"name": "ca"}}}
    return {"apiVersion": "servegraph.io/v1alpha1", "kind": "ServeGraph", "metadata": {"name": name},
            "spec": {"source": source}}  # fmt: skip


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:13]) / os.sysconf("SC_CLK_TCK")


def _a_gets(registry: Any) -> int:
    """A's downloads so far (each a fresh graph, so each a parse)."""
    return sum(1 for r in registry.requests if str(r["name"]).startswith("a"))


def _family_cpu_s(pid: int) -> float:
    """CPU of a process and its live children (the parse children)."""
    total = _cpu_s(pid)
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            total += _cpu_s(int(child))
    return total


async def bench_operator(
    worst: bytes, samples: int, workers: int | None, src: Path | None, a_graphs: int, a_period: float
) -> dict[str, Any]:
    from kubernetes_asyncio import client, watch

    from servegraph.names import REFRESH_ANNOTATION
    from servegraph_testbed import ControlPlane, find_binaries
    from servegraph_testbed.certs import write_pki
    from servegraph_testbed.clients import api_client
    from servegraph_testbed.processes import free_port, http_probe
    from servegraph_testbed.registry import Registry, RegistryServer

    binaries = find_binaries()
    result: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        ControlPlane(binaries, crds=[binaries.kuberay_crds, ROOT / "config" / "crd"]) as cp,
    ):
        pki = write_pki(Path(tmp))
        server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ssl.load_cert_chain(pki.serving_cert, pki.serving_key)
        registry = await RegistryServer(Registry(token=TOKEN), server_ssl).start()
        reg = registry.registry
        cp.kubectl("apply", "-f", str(ROOT / "config" / "rbac" / "role.yaml"))
        cp.kubectl("create", "clusterrolebinding", "bench", "--clusterrole=servegraph-operator", f"--user={USER}")
        port = free_port()
        argv = [sys.executable, "-m", "servegraph.cli", "run", "--health-address", f"127.0.0.1:{port}",
                "--allowed-source-networks=127.0.0.0/8", "--namespace=tenant-a", "--namespace=tenant-b"]  # fmt: skip
        if workers is not None:
            argv.append(f"--parse-workers={workers}")
        env = {"PYTHONPATH": str(src / "src")} if src is not None else None
        op = cp.spawn("servegraph-operator", argv, identity=USER, env=env)
        op.wait_ready(lambda: http_probe(f"http://127.0.0.1:{port}/readyz"), timeout=90)
        assert op.pid is not None
        seen: dict[str, float] = {}
        wanted: dict[str, asyncio.Event] = {}
        async with api_client(cp) as api:
            core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
            for ns in ("tenant-a", "tenant-b"):
                await core.create_namespace({"metadata": {"name": ns}})
                for name, key, value in (("token", "token", TOKEN), ("ca", "ca.crt", pki.ca_cert.read_text())):
                    encoded = {key: base64.b64encode(value.encode()).decode()}
                    await core.create_namespaced_secret(ns, {"metadata": {"name": name}, "data": encoded})

            async def watch_b() -> None:
                w = watch.Watch()
                async for event in w.stream(
                    custom.list_namespaced_custom_object, "ray.io", "v1", "tenant-b", "rayservices",
                    timeout_seconds=3600,
                ):  # fmt: skip
                    text = event["object"].get("spec", {}).get("serveConfigV2", "")
                    for marker, ready in wanted.items():
                        if marker in text and marker not in seen:
                            seen[marker] = time.monotonic()
                            ready.set()

            watcher = asyncio.create_task(watch_b())
            data, marker = b_graph(0)
            reg.publish("b", data)
            wanted[marker] = asyncio.Event()
            await custom.create_namespaced_custom_object(
                "servegraph.io", "v1alpha1", "tenant-b", "servegraphs", _servegraph("b", registry.url("b"))
            )
            await asyncio.wait_for(wanted[marker].wait(), 60)

            async def refresh(ns: str, name: str, value: str) -> None:
                patch = {"metadata": {"annotations": {REFRESH_ANNOTATION: value}}}
                await custom.patch_namespaced_custom_object(
                    "servegraph.io", "v1alpha1", ns, "servegraphs", name, patch,
                    _content_type="application/merge-patch+json",
                )  # fmt: skip

            counter = [0]

            async def b_latencies() -> list[float]:
                out = []
                for _ in range(samples):
                    counter[0] += 1
                    data, marker = b_graph(counter[0])
                    wanted[marker] = asyncio.Event()
                    start = time.monotonic()
                    reg.publish("b", data)
                    await refresh("tenant-b", "b", str(counter[0]))
                    await asyncio.wait_for(wanted[marker].wait(), 120)
                    out.append(seen[marker] - start)
                    await asyncio.sleep(0.5)
                return out

            idle = await b_latencies()
            for i in range(a_graphs):
                reg.publish(f"a{i}", another(worst, i))
                await custom.create_namespaced_custom_object(
                    "servegraph.io", "v1alpha1", "tenant-a", "servegraphs", _servegraph(f"a{i}", registry.url(f"a{i}"))
                )

            async def a_republishes() -> None:
                n = 0
                while True:
                    n += 1
                    for i in range(a_graphs):
                        reg.publish(f"a{i}", another(worst, n * 100 + i))
                        await refresh("tenant-a", f"a{i}", str(n))
                    await asyncio.sleep(a_period)

            driver = asyncio.create_task(a_republishes())
            await asyncio.sleep(3)  # A's parses under way
            cpu0, wall0, gets0 = _family_cpu_s(op.pid), time.monotonic(), _a_gets(reg)
            busy = await b_latencies()
            wall = time.monotonic() - wall0
            result["operator_cpu_share"] = (_family_cpu_s(op.pid) - cpu0) / wall
            result["a_downloads_per_s"] = (_a_gets(reg) - gets0) / wall
            driver.cancel()
            watcher.cancel()
            for task in (driver, watcher):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        await registry.stop()
        cp.unspawn(op)
    result.update(idle=summary(idle), busy=summary(busy))
    result["ratio"] = result["busy"]["median"] / result["idle"]["median"]
    print(f"  operator: {result}", file=sys.stderr, flush=True)
    return result


# -- main -------------------------------------------------------------------------------


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    return f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="parser,operator")
    parser.add_argument("--samples", type=int, default=12, help="B's publishes per phase")
    parser.add_argument(
        "--workers", type=int, default=default_workers(), help="parse children (default: the operator's)"
    )
    parser.add_argument("--a-graphs", type=int, default=2, help="A's ServeGraphs (operator part)")
    parser.add_argument("--a-period", type=float, default=1.0, help="seconds between A's republishes (operator part)")
    parser.add_argument("--operator-src", type=Path, help="run the operator from this checkout (no --parse-workers)")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    started = time.monotonic()
    print(f"machine: {machine()}; load average at start {_load()}")
    worst = costliest()
    gc.collect()
    gc.freeze()  # as in the parse child: no long-lived objects for the collector to walk
    cpu = time.process_time()
    with contextlib.suppress(GraphError):
        parse_graph(worst, max_bytes=len(worst))
    print(
        f"A's graph: {len(worst):,} bytes, {time.process_time() - cpu:.2f} s of parse CPU here, refused after parsing"
    )
    if "parser" in parts:
        rows = asyncio.run(bench_parser(worst, args.samples, args.workers, streams=2))
        print("\n| parse children | B idle: median / p90 / max | A busy: median / p90 / max | busy ÷ idle (median) |")
        print("|---|---:|---:|---:|")
        for r in rows:
            i, b = r["idle"], r["busy"]
            print(
                f"| {r['label']} | {_ms(i['median'])} / {_ms(i['p90'])} / {_ms(i['max'])} "
                f"| {_ms(b['median'])} / {_ms(b['p90'])} / {_ms(b['max'])} | {r['ratio']:.2f}x |"
            )
    if "operator" in parts:
        workers = None if args.operator_src is not None else args.workers
        r = asyncio.run(bench_operator(worst, args.samples, workers, args.operator_src, args.a_graphs, args.a_period))
        who = f"operator from {args.operator_src}" if args.operator_src else f"operator, --parse-workers={workers}"
        i, b = r["idle"], r["busy"]
        print(f"\n| B's publish → RayService updated ({who}) | median | p90 | max |")
        print("|---|---:|---:|---:|")
        print(f"| A idle | {_ms(i['median'])} | {_ms(i['p90'])} | {_ms(i['max'])} |")
        print(f"| A republishing every {args.a_period:g} s | {_ms(b['median'])} | {_ms(b['p90'])} | {_ms(b['max'])} |")
        print(f"| busy ÷ idle (median) | {r['ratio']:.2f}x | | |")
        print(
            f"\nwhile A was busy: {r['a_downloads_per_s']:.1f} downloads (parses) of A's graph a second; "
            f"the operator and its parse children used {r['operator_cpu_share']:.2f} CPUs"
        )
    print(f"\nload average at end {_load()}; took {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
