"""The operator on the real control plane: throughput against the API server's own limit
and against the floor of its own writes, a publish storm, spec-change latency,
steady-state cost, and memory.

Runs etcd + kube-apiserver (audit log on), a graph registry over HTTPS, and
`servegraph run` as its own process bound by config/rbac/role.yaml, with its
"graph published" endpoint on. KubeRay is not started: 1,000 RayClusters would
measure KubeRay, not us.

--distinct (what clusters look like): every ServeGraph reads its own graph
(bench/tenant_graphs.py: 5-200 nodes, some on GPUs, some autoscaled, 1-4 applications,
the same for a given --seed), spread over --namespaces tenant namespaces; then a tenth
of them republish at once (bench/operator_storm.py), announced through the events
endpoint, then again through the refresh annotation. --shared: every ServeGraph reads
one 20-node graph in one namespace, which the operator parses once and shares by
digest: the cache-hit case of the earlier tables of BENCHMARKS.md; no storm.

--cpus-apart: the API server and etcd on half the CPUs, the operator and the bench on
the others, as deployed (the operator's pod does not share the control plane's CPUs).
Without it every process shares every CPU, and the operator's time against its floor
measures its CPU as much as its writes.

    python bench/operator_bench.py --distinct --counts 1000 --json-out build/bench/d.json --check bench/baseline.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import json
import os
import platform
import random
import ssl
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import regression  # noqa: E402
import tenant_graphs  # noqa: E402
from gauge import python_gauge_s  # noqa: E402
from operator_floor import (  # noqa: E402
    FloorItem,
    configmap,
    floor_create,
    floor_update,
    missing,
    per_item,
    raw_apply,
    requests_by_kind,
)
from operator_storm import run_storm  # noqa: E402
from watching import applied, key_of, watch_until  # noqa: E402

from servegraph.graph import encode, parse_graph  # noqa: E402
from servegraph.kube import KubeClient, connect  # noqa: E402
from servegraph.names import GROUP, PLURAL, VERSION  # noqa: E402
from servegraph.render import RayServiceOptions, render_rayservice  # noqa: E402
from servegraph.v1 import graph_pb2  # noqa: E402
from servegraph_testbed import WRITE_VERBS, ControlPlane, find_binaries, launch  # noqa: E402
from servegraph_testbed.certs import write_pki  # noqa: E402
from servegraph_testbed.clients import api_client  # noqa: E402
from servegraph_testbed.processes import free_port, http_probe  # noqa: E402
from servegraph_testbed.registry import Registry, RegistryServer  # noqa: E402

TOKEN = "bench-token"
EVENTS_TOKEN = "bench-events-token"
USER = "servegraph-operator"
SYSTEM_NS = "bench-system"
MiB = 1024 * 1024


def shared_graph_bytes(nodes: int = 20) -> bytes:
    """The shared case's graph: one application, a binary tree of `nodes` deployments."""
    g = graph_pb2.Graph(name="bench", version="1", schema_version=1)
    app = g.applications.add(name="app", route_prefix="/app", ingress="n0")
    for i in range(nodes):
        node = app.nodes[f"n{i}"]
        node.deployment.import_path = f"models.m{i % 5}:Model"
        for j in (2 * i + 1, 2 * i + 2):
            if j < nodes:
                node.deployment.args.add(node=graph_pb2.NodeRef(id=f"n{j}"))
        node.resources.num_cpus = 0.5
        node.scaling.num_replicas = 1
    return encode(g)


@dataclass
class Fleet:
    """The ServeGraphs of one round: their keys (`namespace/name`), graphs and URLs."""

    mode: str
    count: int
    namespaces: list[str]
    keys: list[str]
    graphs: list[bytes]
    graph_names: list[str]
    urls: list[str]


def make_fleet(mode: str, count: int, spread: int, seed: int, registry: RegistryServer) -> Fleet:
    namespaces = [f"bench-{count}-{j:02d}" for j in range(spread)] if spread > 1 else [f"bench-{count}"]
    shared = shared_graph_bytes()
    if mode == "shared":
        registry.registry.publish("g", shared)
    keys, graphs, names = [], [], []
    for i in range(count):
        keys.append(f"{namespaces[i % len(namespaces)]}/sg-{i:05d}")
        if mode == "shared":
            graphs.append(shared)
            names.append("g")
        else:
            names.append(f"t{i:05d}")
            graphs.append(tenant_graphs.graph_bytes(seed, i))
            registry.registry.publish(names[-1], graphs[-1])
    return Fleet(mode, count, namespaces, keys, graphs, names, [registry.url(n) for n in names])


def graph_stats(fleet: Fleet, seed: int) -> dict[str, Any]:
    if fleet.mode == "shared":
        return {"distinct": 1, "nodes": 20, "applications": 1}
    shapes = tenant_graphs.shapes(seed, fleet.count)
    nodes = [s.nodes for s in shapes]
    return {
        "distinct": len(set(fleet.graphs)),
        "nodes_min": min(nodes),
        "nodes_median": statistics.median(nodes),
        "nodes_max": max(nodes),
        "nodes_total": sum(nodes),
        "gpu_graphs": sum(s.gpu for s in shapes),
        "autoscaled_graphs": sum(s.autoscaled for s in shapes),
        "graphs_by_applications": {a: sum(s.apps == a for s in shapes) for a in range(1, tenant_graphs.MAX_APPS + 1)},
    }


def render_all(graphs: list[bytes], names: list[str]) -> list[dict[str, Any]]:
    """The RayService of each ServeGraph, without a namespace (set per copy); one parse per distinct graph."""
    parsed: dict[bytes, Any] = {}
    out = []
    for data, name in zip(graphs, names, strict=True):
        graph = parsed.get(data)
        if graph is None:
            graph = parsed[data] = parse_graph(data)
        out.append(render_rayservice(graph, RayServiceOptions(name=name)))
    return out


def placed(manifest: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def floor_ns(namespace: str) -> str:
    return "floor-" + namespace.removeprefix("bench-")


def tree_pids(pid: int) -> list[int]:
    """`pid` and its live descendants (the operator's graph-parse children among them)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(parents.get(p, ()))
    return found


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its reaped children so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(pid: int) -> float:
    """CPU of the operator and its parse children: a parse in a child is the operator's work."""
    return sum(cpu_s(p) for p in tree_pids(pid))


def pin(pids: list[int], cpus: set[int]) -> None:
    """Every thread of each of `pids` onto `cpus` (threads and processes made later inherit it
    from the thread that makes them)."""
    for p in pids:
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            with contextlib.suppress(OSError):  # ended meanwhile
                os.sched_setaffinity(int(tid), cpus)


def cpus_apart() -> tuple[set[int], set[int]]:
    """(the control plane's CPUs, everyone else's): the first half, the rest."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--cpus-apart needs at least two CPUs")
    half = len(cpus) // 2
    return set(cpus[:half]), set(cpus[half:])


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


PROGRESS_DEADLINE: str | None = None
"""spec.rollout.progressDeadline of the bench's ServeGraphs (`--progress-deadline`); None: the default 10m."""


def servegraph(name: str, url: str) -> dict[str, Any]:
    """The bench's ServeGraph: `url`, with the token and CA from the namespace's Secrets."""
    spec: dict[str, Any] = {
        "source": {"url": url, "tokenSecretRef": {"name": "token"}, "caBundle": {"secretRef": {"name": "ca"}}}
    }
    if PROGRESS_DEADLINE is not None:
        spec["rollout"] = {"progressDeadline": PROGRESS_DEADLINE}
    return {"apiVersion": "servegraph.io/v1alpha1", "kind": "ServeGraph", "metadata": {"name": name}, "spec": spec}


async def create_servegraphs(api: Any, fleet: Fleet, concurrency: int) -> None:
    custom = client.CustomObjectsApi(api)
    sem = asyncio.Semaphore(concurrency)

    async def one(key: str, url: str) -> None:
        ns, name = key.split("/")
        async with sem:
            await custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, servegraph(name, url))

    await asyncio.gather(*(one(k, u) for k, u in zip(fleet.keys, fleet.urls, strict=True)))


async def metrics_text(metrics_url: str) -> str:
    """One scrape of the operator's /metrics."""
    async with aiohttp.ClientSession() as s, s.get(metrics_url) as r:
        return await r.text()


async def gc_cpu_s(metrics_url: str) -> float:
    """The operator's garbage-collector CPU so far, from its metrics."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(await metrics_text(metrics_url))
        for sample in family.samples
        if sample.name == "servegraph_gc_cpu_seconds_total"
    )


async def secrets(api: Any, namespace: str, ca_pem: str) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespace({"metadata": {"name": namespace}})
    for name, key, value in (("token", "token", TOKEN), ("ca", "ca.crt", ca_pem)):
        data = {key: base64.b64encode(value.encode()).decode()}
        await core.create_namespaced_secret(namespace, {"metadata": {"name": name}, "data": data})


async def statuses(api: Any, namespaces: list[str]) -> dict[str, dict[str, Any]]:
    custom = client.CustomObjectsApi(api)
    out = {}
    for ns in namespaces:
        listed = await custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
        for item in listed["items"]:
            out[key_of(item)] = item.get("status") or {}
    return out


class Bench:
    """The measurements, in the order they run; `floors` keeps the floor's ServeGraphs for the storm's floor.

    The bench's own writes (the users' creates, raw, floor) go through the operator's client
    (`kube`, its session and raw JSON): kubernetes_asyncio's default session reads ~/.netrc and
    the proxy variables per request, CPU the two shared cores would lose to the bench.
    """

    def __init__(
        self,
        args: argparse.Namespace,
        cp: ControlPlane,
        registry: Registry,
        api: Any,
        kube: KubeClient,
        op_pid: int,
        ca_pem: str,
        metrics_url: str,
    ) -> None:
        self.args, self.cp, self.registry, self.api, self.kube = args, cp, registry, api, kube
        self.op_pid, self.ca_pem, self.metrics_url = op_pid, ca_pem, metrics_url
        self.floors: dict[str, FloorItem] = {}

    def server_cpu_s(self) -> float:
        return cpu_s(self.cp.pids["kube-apiserver"]) + cpu_s(self.cp.pids["etcd"])

    async def round(self, fleet: Fleet) -> dict[str, Any]:
        args, api = self.args, self.api
        for ns in fleet.namespaces:
            await secrets(api, ns, self.ca_pem)
        mark = self.cp.audit_log.offset()
        gc0 = await gc_cpu_s(self.metrics_url)
        start, cpu0, server0 = time.monotonic(), tree_cpu_s(self.op_pid), self.server_cpu_s()

        def done(obj: dict[str, Any]) -> str | None:
            return key_of(obj) if applied(obj) else None

        waiting = asyncio.create_task(
            watch_until(api, GROUP, VERSION, PLURAL, done, fleet.keys, args.timeout_s, start=start)
        )
        await create_servegraphs(self.kube.api, fleet, args.workers)
        seen = await waiting
        operator_s = time.monotonic() - start
        operator_cpu = tree_cpu_s(self.op_pid) - cpu0
        server_cpu = self.server_cpu_s() - server0
        gc_cpu = await gc_cpu_s(self.metrics_url) - gc0  # read after the CPU: a scrape costs the operator some
        if len(seen) < fleet.count:
            raise RuntimeError(
                f"{fleet.count - len(seen)} of {fleet.count} ServeGraphs not Applied in {args.timeout_s} s"
            )
        await asyncio.sleep(2)  # the Events posted after the last status writes
        events = self.cp.audit_log.events(user=USER, since=mark)
        spaces = set(fleet.namespaces)
        op_writes = per_item(requests_by_kind(events, spaces, writes=True), fleet.count)
        op_reads = per_item(requests_by_kind(events, spaces, writes=False), fleet.count)

        bare = render_all(fleet.graphs, [k.split("/")[1] for k in fleet.keys])
        raw_ns = f"raw-{fleet.count}"
        await client.CoreV1Api(api).create_namespace({"metadata": {"name": raw_ns}})
        raw_s = await raw_apply(self.kube, [placed(m, raw_ns) for m in bare], args.workers)

        written = await statuses(api, fleet.namespaces)
        for ns in fleet.namespaces:
            await client.CoreV1Api(api).create_namespace({"metadata": {"name": floor_ns(ns)}})
        items = []
        for key, manifest, data, url in zip(fleet.keys, bare, fleet.graphs, fleet.urls, strict=True):
            ns, name = key.split("/")
            fns = floor_ns(ns)
            spec = servegraph(name, url)["spec"]
            cm = configmap(fns, name, {sha256_hex(data): data})
            items.append(FloorItem(fns, name, spec, cm, placed(manifest, fns), written[key]))
        mark = self.cp.audit_log.offset()
        client0, server0 = time.process_time(), self.server_cpu_s()
        floor_s = await floor_create(self.kube, items, args.workers)
        floor_client_cpu = time.process_time() - client0
        floor_server_cpu = self.server_cpu_s() - server0
        floor_events = self.cp.audit_log.events(since=mark)
        floor_writes = per_item(requests_by_kind(floor_events, {i.namespace for i in items}, writes=True), fleet.count)
        for key, item in zip(fleet.keys, items, strict=True):
            self.floors[key] = item
        return {
            "operator_s": operator_s,
            "operator_per_s": fleet.count / operator_s,
            "raw_s": raw_s,
            "raw_per_s": fleet.count / raw_s,
            "ratio": raw_s / operator_s,
            "floor_s": floor_s,
            "floor_ratio": raw_s / floor_s,
            "operator_vs_floor": floor_s / operator_s,
            "operator_cpu_s": operator_cpu,
            "apiserver_etcd_cpu_s": server_cpu,
            # What the floor's writes cost its client (this process) and the API server: the
            # operator's CPU beyond its API calls is operator_cpu_s less floor_client_cpu_s.
            "floor_client_cpu_s": floor_client_cpu,
            "floor_apiserver_etcd_cpu_s": floor_server_cpu,
            "operator_cpu_beyond_calls_ms": (operator_cpu - floor_client_cpu) / fleet.count * 1000,
            # Part of operator_cpu_s: the cyclic garbage collector's runs (servegraph_gc_cpu_seconds_total).
            "operator_gc_cpu_s": gc_cpu,
            "operator_gc_ms_per_servegraph": gc_cpu / fleet.count * 1000,
            "operator_writes_per_servegraph": op_writes,
            "floor_writes_per_servegraph": floor_writes,
            "floor_missing_writes": missing(op_writes, floor_writes),
            "operator_reads_per_servegraph": op_reads,
            "graphs": graph_stats(fleet, args.seed),
        }

    async def storm(self, fleet: Fleet, events_port: int, via: str, version: int) -> dict[str, Any]:
        """The storm's tenants publish `version` of their graphs at once, announced `via`."""
        args = self.args
        picks = tenant_graphs.storm(args.seed, fleet.count, args.storm_fraction)
        keys = [fleet.keys[i] for i in picks]
        new = {fleet.keys[i]: (fleet.graph_names[i], tenant_graphs.graph_bytes(args.seed, i, version)) for i in picks}
        mark = self.cp.audit_log.offset()
        cpu0 = tree_cpu_s(self.op_pid)
        result = await run_storm(
            self.api,
            self.registry,
            new,
            {fleet.keys[i]: fleet.urls[i] for i in picks},
            via=via,
            events_port=events_port,
            events_token=EVENTS_TOKEN,
            concurrency=args.workers,
            within=args.timeout_s,
            seed=args.seed + version,
        )
        # Until the last republished ServeGraph reported Applied: the endpoint's and the reconciles' CPU.
        result["operator_cpu_s"] = tree_cpu_s(self.op_pid) - cpu0
        await asyncio.sleep(2)
        events = self.cp.audit_log.events(user=USER, since=mark)
        op_writes = per_item(requests_by_kind(events, set(fleet.namespaces), writes=True), len(picks))

        # The floor: the same republish in the floor's namespaces, as one minimal client would write
        # it; its ConfigMap gets the new version beside those kept, as the store sends it.
        written = await statuses(self.api, fleet.namespaces)
        bare = render_all([new[k][1] for k in keys], [k.split("/")[1] for k in keys])
        items = []
        for key, manifest in zip(keys, bare, strict=True):
            item = self.floors[key]
            data = new[key][1]
            items.append(
                FloorItem(
                    item.namespace, item.name, item.spec, item.configmap,
                    placed(manifest, item.namespace), written[key], item.body,
                    {sha256_hex(data): base64.b64encode(data).decode()},
                )
            )  # fmt: skip
        mark = self.cp.audit_log.offset()
        floor_s = await floor_update(self.kube, items, via == "events", args.workers)
        floor_events = self.cp.audit_log.events(since=mark)
        floor_writes = per_item(requests_by_kind(floor_events, {i.namespace for i in items}, writes=True), len(items))
        all_applied = result["all_applied_s"]
        result.update(
            {
                "version": version,
                "floor_s": floor_s,
                "vs_floor": floor_s / all_applied if all_applied else None,
                "operator_writes_per_servegraph": op_writes,
                "floor_writes_per_servegraph": floor_writes,
                "floor_missing_writes": missing(op_writes, floor_writes),
            }
        )
        return result

    async def spec_changes(self, fleet: Fleet) -> dict[str, float]:
        """Spec change → RayService updated, one at a time, with every ServeGraph present."""
        custom = client.CustomObjectsApi(self.api)
        rng = random.Random(self.args.seed)
        latencies = []
        for i in range(self.args.changes):
            ns, name = rng.choice(fleet.keys).split("/")
            image = f"example.com/ray:{i}"
            start = time.monotonic()
            await custom.patch_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, name, {"spec": {"rayService": {"image": image}}},
                _content_type="application/merge-patch+json",
            )  # fmt: skip
            while True:
                rs = await custom.get_namespaced_custom_object("ray.io", "v1", ns, "rayservices", name)
                if (
                    rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
                    == image
                ):
                    break
                await asyncio.sleep(0.01)
            latencies.append(time.monotonic() - start)
        if not latencies:
            return {}
        latencies.sort()
        return {
            "latency_p50_s": statistics.median(latencies),
            "latency_p99_s": latencies[int(0.99 * (len(latencies) - 1))],
        }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    global PROGRESS_DEADLINE
    binaries = find_binaries()
    # 10,000 distinct graphs in three copies (operator, raw, floor) and their history outgrow the test bed's 256 MiB.
    launch.ETCD_QUOTA_BYTES = args.etcd_quota_mib * MiB
    results: dict[str, Any] = {"mode": args.mode, "seed": args.seed, "namespaces": args.namespaces, "counts": {}}
    # What makes two runs comparable (bench/regression.py refuses to compare across a change).
    results["config"] = {
        "seed": args.seed,
        "namespaces": args.namespaces,
        "workers": args.workers,
        "changes": args.changes,
        "storm_fraction": args.storm_fraction if args.mode == "distinct" else 0,
        "storm_via": args.storm_via if args.mode == "distinct" else [],
    }
    if args.progress_deadline is not None:
        PROGRESS_DEADLINE = results["config"]["progress_deadline"] = args.progress_deadline
    if args.cpus_apart:
        results["config"]["cpus_apart"] = True
    gauges = [python_gauge_s()]  # before and after the run: the machine's speed around it
    with (
        ControlPlane(binaries, crds=[binaries.kuberay_crds, ROOT / "config" / "crd"], audit=True) as cp,
        tempfile.TemporaryDirectory() as tmp,
    ):
        pki = write_pki(Path(tmp))
        server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ssl.load_cert_chain(pki.serving_cert, pki.serving_key)
        registry = await RegistryServer(Registry(token=TOKEN), server_ssl).start()
        fleets = [make_fleet(args.mode, c, args.namespaces, args.seed, registry) for c in args.counts]
        cp.kubectl("apply", "-f", str(ROOT / "config" / "rbac" / "role.yaml"))
        cp.kubectl("create", "clusterrolebinding", "bench", "--clusterrole=servegraph-operator", f"--user={USER}")
        cp.kubectl("create", "namespace", SYSTEM_NS)
        cp.kubectl("create", "secret", "generic", "events", "-n", SYSTEM_NS, f"--from-literal=token={EVENTS_TOKEN}")
        port, events_port = free_port(), free_port()
        argv = [
            sys.executable,
            "-m",
            "servegraph.cli",
            "run",
            "--health-address",
            f"127.0.0.1:{port}",
            "--events-address",
            f"127.0.0.1:{events_port}",
            f"--events-token-secret={SYSTEM_NS}/events",
            "--workers",
            str(args.workers),
            # The registry listens on loopback, which the default source policy refuses.
            "--allowed-source-networks=127.0.0.0/8",
            # Only the measured namespaces: the floor loop's ServeGraphs must not be reconciled.
            *(f"--namespace={ns}" for fleet in fleets for ns in fleet.namespaces),
        ]
        op = cp.spawn("servegraph-operator", argv, identity=USER)
        op.wait_ready(lambda: http_probe(f"http://127.0.0.1:{port}/readyz"), timeout=60)
        await asyncio.sleep(2)
        assert op.pid is not None
        if args.cpus_apart:
            # As deployed: the control plane on its own CPUs, the operator (and here the bench:
            # users, registry, observer, the floor's client) on the others.
            control, rest = cpus_apart()
            pin([p for c in ("kube-apiserver", "etcd") for p in tree_pids(cp.pids[c])], control)
            pin(tree_pids(op.pid), rest)  # its parse children too
            pin([os.getpid()], rest)  # not its descendants: the control plane is one
            results["cpus"] = {"control_plane": sorted(control), "operator_and_bench": sorted(rest)}
        results["rss_idle_mib"] = rss_mib(op.pid)
        fast = await connect(str(cp.kubeconfig()))
        try:
            async with api_client(cp) as api:
                metrics_url = f"http://127.0.0.1:{port}/metrics"
                bench = Bench(
                    args, cp, registry.registry, api, KubeClient(fast), op.pid, pki.ca_cert.read_text(), metrics_url
                )
                total = 0
                for fleet in fleets:
                    results["counts"][fleet.count] = await bench.round(fleet)
                    total += fleet.count
                    print(json.dumps({f"{args.mode}-{fleet.count}": results["counts"][fleet.count]}), flush=True)
                results["servegraphs"] = total
                results["rss_loaded_mib"] = rss_mib(op.pid)
                results["rss_parse_children_mib"] = sum(rss_mib(p) for p in tree_pids(op.pid)[1:])

                if args.mode == "distinct" and args.storm_fraction > 0:
                    results["storms"] = []
                    for version, via in enumerate(args.storm_via, start=2):
                        results["storms"].append(await bench.storm(fleets[-1], events_port, via, version))
                        print(json.dumps({f"storm via {via}": results["storms"][-1]}), flush=True)
                results.update(await bench.spec_changes(fleets[-1]))

                # steady state: nothing changes for quiet_s seconds
                await asyncio.sleep(5)
                mark = cp.audit_log.offset()
                await asyncio.sleep(args.quiet_s)
                events = cp.audit_log.events(user=USER, since=mark)
                minutes = args.quiet_s / 60
                results["steady_writes_per_min"] = (
                    sum(e["verb"] in WRITE_VERBS for e in events) / minutes if minutes else None
                )
                verbs: dict[str, int] = {}
                for e in events:
                    verbs[e["verb"]] = verbs.get(e["verb"], 0) + 1
                results["steady_requests_by_verb"] = verbs
                results["rss_after_mib"] = rss_mib(op.pid)
                gauges.append(python_gauge_s())
                results["python_gauge_samples_s"] = gauges
                results["python_gauge_s"] = statistics.mean(gauges)
                results["metrics_sample"] = [
                    line
                    for line in (await metrics_text(metrics_url)).splitlines()
                    if line.startswith(
                        (
                            "servegraph_api_writes_total",
                            "servegraph_reconciles_total",
                            "servegraph_watch_echoes_dropped_total",
                            "servegraph_gc_",
                        )
                    )
                ]
        finally:
            await fast.close()
        await registry.stop()
        cp.unspawn(op)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", default="100,500,1000", help="ServeGraphs per round (cumulative)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--distinct", dest="mode", action="store_const", const="distinct", help="a graph per ServeGraph (default)"
    )
    mode.add_argument(
        "--shared", dest="mode", action="store_const", const="shared", help="one graph for all: the cache-hit case"
    )
    parser.set_defaults(mode="distinct")
    parser.add_argument("--seed", type=int, default=1, help="the distinct graphs and the storm's tenants")
    parser.add_argument("--namespaces", type=int, help="tenant namespaces per round (default: 10 distinct, 1 shared)")
    parser.add_argument(
        "--storm-fraction", type=float, default=0.1, help="share of graphs republished at once (distinct)"
    )
    parser.add_argument(
        "--storm-via",
        default="events,annotation",
        help="storms in turn, each a new version: events (POST /v1/events, the production path), "
        "annotation (the refresh annotation written straight: the reconcile without the endpoint)",
    )
    parser.add_argument(
        "--progress-deadline",
        help="the ServeGraphs' rollout.progressDeadline (no KubeRay runs here, so no rollout completes: "
        "a run outlasting the default 10m fails every rollout while it measures; make bench-large sets 2h)",
    )
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--quiet-s", type=float, default=60)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--timeout-s", type=float, default=1800, help="longest wait for all Applied (per round, storm)")
    parser.add_argument(
        "--cpus-apart",
        action="store_true",
        help="pin the API server and etcd to half the CPUs, the operator and the bench to the rest "
        "(as deployed: the operator does not share the control plane's CPUs); not comparable with runs without",
    )
    parser.add_argument("--etcd-quota-mib", type=int, default=4096, help="etcd's space quota (the test bed's: 256)")
    parser.add_argument("--json-out", type=Path, help="write the results here (input of bench/regression.py)")
    parser.add_argument("--check", type=Path, metavar="BASELINE", help="exit 1 if a figure regressed against it")
    args = parser.parse_args()
    args.counts = [int(c) for c in args.counts.split(",")]
    if len(set(args.counts)) != len(args.counts) or min(args.counts) < 1:
        parser.error(
            f"--counts {args.counts}: each round needs its own positive count (its namespaces are named by it)"
        )
    args.storm_via = [v for v in args.storm_via.split(",") if v]
    if not set(args.storm_via) <= {"events", "annotation"}:
        parser.error(f"--storm-via: {args.storm_via}: each must be events or annotation")
    if args.namespaces is None:
        args.namespaces = 10 if args.mode == "distinct" else 1
    results = asyncio.run(main_async(args))
    results["machine"] = f"{platform.machine()}, {os.cpu_count()} cores"  # the machine's, not this process's affinity
    results["python"] = platform.python_version()
    print(json.dumps(results, indent=2))
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(results, indent=2) + "\n")
    if args.check is not None and not regression.check([json.loads(json.dumps(results))], args.check):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
