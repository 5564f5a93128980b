"""The operator on the real control plane: throughput against the API server's own
limit, spec-change latency, steady-state cost, and memory.

Runs etcd + kube-apiserver (audit log on), a graph registry over HTTPS, and
`servegraph run` as its own process bound by config/rbac/role.yaml. KubeRay is not
started: 1,000 RayClusters would measure KubeRay, not us.

    python bench/operator_bench.py --counts 100,500,1000 --changes 200 --quiet-s 60
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import json
import os
import platform
import random
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from servegraph.graph import encode, parse_graph  # noqa: E402
from servegraph.render import RayServiceOptions, render_rayservice  # noqa: E402
from servegraph.v1 import graph_pb2  # noqa: E402
from servegraph_testbed import WRITE_VERBS, ControlPlane, find_binaries  # noqa: E402
from servegraph_testbed.certs import write_pki  # noqa: E402
from servegraph_testbed.clients import api_client  # noqa: E402
from servegraph_testbed.processes import free_port, http_probe  # noqa: E402
from servegraph_testbed.registry import Registry, RegistryServer  # noqa: E402

TOKEN = "bench-token"
USER = "servegraph-operator"


def graph_bytes(nodes: int = 20) -> bytes:
    """One application, a binary tree of `nodes` deployments."""
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


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its reaped children so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def wait_applied(api: Any, namespace: str, count: int, within: float) -> float:
    """Watch (not poll) until `count` ServeGraphs report Applied=True: polling a list
    of a thousand objects would load the API server during the operator's run only."""
    from kubernetes_asyncio import watch

    custom = client.CustomObjectsApi(api)
    start = time.monotonic()
    applied: set[str] = set()
    w = watch.Watch()
    async with asyncio.timeout(within):
        async for event in w.stream(
            custom.list_namespaced_custom_object,
            "servegraph.io",
            "v1alpha1",
            namespace,
            "servegraphs",
            timeout_seconds=int(within),
        ):
            obj = event["object"]
            conditions = (obj.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Applied" and c["status"] == "True" for c in conditions):
                applied.add(obj["metadata"]["name"])
            if len(applied) >= count:
                w.stop()
                break
    return time.monotonic() - start


def servegraph(name: str, url: str) -> dict[str, Any]:
    """The bench's ServeGraph: `url`, with the token and CA from the namespace's Secrets."""
    return {
        "apiVersion": "servegraph.io/v1alpha1",
        "kind": "ServeGraph",
        "metadata": {"name": name},
        "spec": {
            "source": {"url": url, "tokenSecretRef": {"name": "token"}, "caBundle": {"secretRef": {"name": "ca"}}}
        },
    }


async def create_servegraphs(api: Any, namespace: str, url: str, names: list[str], concurrency: int) -> None:
    custom = client.CustomObjectsApi(api)
    sem = asyncio.Semaphore(concurrency)

    async def one(name: str) -> None:
        async with sem:
            await custom.create_namespaced_custom_object(
                "servegraph.io", "v1alpha1", namespace, "servegraphs", servegraph(name, url)
            )

    await asyncio.gather(*(one(n) for n in names))


async def raw_apply(api: Any, namespace: str, names: list[str], data: bytes, concurrency: int) -> float:
    """The API server's limit: the same RayServices, server-side applied in a tight loop."""
    custom = client.CustomObjectsApi(api)
    graph = parse_graph(data)
    manifests = [render_rayservice(graph, RayServiceOptions(name=n, namespace=namespace)) for n in names]
    sem = asyncio.Semaphore(concurrency)

    async def one(m: dict[str, Any]) -> None:
        async with sem:
            await custom.patch_namespaced_custom_object(
                "ray.io", "v1", namespace, "rayservices", m["metadata"]["name"], m,
                field_manager="bench", force=True, _content_type="application/apply-patch+yaml",
            )  # fmt: skip

    start = time.monotonic()
    await asyncio.gather(*(one(m) for m in manifests))
    return time.monotonic() - start


async def raw_operator_writes(
    api: Any, namespace: str, names: list[str], url: str, data: bytes, status: dict[str, Any], concurrency: int
) -> float:
    """The floor for the operator's path: its writes with no operator in between.

    Per ServeGraph: create it, server-side apply its RayService (owned by it), patch its
    status with what the operator wrote in the measured run, post one Event. The time
    this takes is the best the operator could do on this API server.
    """
    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    graph = parse_graph(data)
    sem = asyncio.Semaphore(concurrency)

    async def one(name: str) -> None:
        async with sem:
            sg = await custom.create_namespaced_custom_object(
                "servegraph.io", "v1alpha1", namespace, "servegraphs", servegraph(name, url)
            )
            meta = sg["metadata"]
            owner = {"apiVersion": "servegraph.io/v1alpha1", "kind": "ServeGraph", "name": name, "uid": meta["uid"],
                     "controller": True, "blockOwnerDeletion": True}  # fmt: skip
            m = render_rayservice(graph, RayServiceOptions(name=name, namespace=namespace, owner_references=(owner,)))
            await custom.patch_namespaced_custom_object(
                "ray.io", "v1", namespace, "rayservices", name, m,
                field_manager="bench", force=True, _content_type="application/apply-patch+yaml",
            )  # fmt: skip
            await custom.patch_namespaced_custom_object_status(
                "servegraph.io", "v1alpha1", namespace, "servegraphs", name, {"status": status},
                _content_type="application/merge-patch+json",
            )  # fmt: skip
            now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            await core.create_namespaced_event(namespace, {
                "metadata": {"generateName": f"{name}."},
                "involvedObject": {"apiVersion": "servegraph.io/v1alpha1", "kind": "ServeGraph", "name": name,
                                   "namespace": namespace, "uid": meta["uid"]},
                "type": "Normal", "reason": "Applied", "message": f"applied RayService {name}",
                "source": {"component": "bench"}, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
                "reportingComponent": "bench", "reportingInstance": "bench",
            })  # fmt: skip

    start = time.monotonic()
    await asyncio.gather(*(one(n) for n in names))
    return time.monotonic() - start


async def secrets(api: Any, namespace: str, ca_pem: str) -> None:
    core = client.CoreV1Api(api)
    await core.create_namespace({"metadata": {"name": namespace}})
    for name, key, value in (("token", "token", TOKEN), ("ca", "ca.crt", ca_pem)):
        data = {key: base64.b64encode(value.encode()).decode()}
        await core.create_namespaced_secret(namespace, {"metadata": {"name": name}, "data": data})


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    binaries = find_binaries()
    results: dict[str, Any] = {"counts": {}}
    with (
        ControlPlane(binaries, crds=[binaries.kuberay_crds, ROOT / "config" / "crd"], audit=True) as cp,
        tempfile.TemporaryDirectory() as tmp,
    ):
        pki = write_pki(Path(tmp))
        server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ssl.load_cert_chain(pki.serving_cert, pki.serving_key)
        registry = await RegistryServer(Registry(token=TOKEN), server_ssl).start()
        data = graph_bytes()
        registry.registry.publish("g", data)
        cp.kubectl("apply", "-f", str(ROOT / "config" / "rbac" / "role.yaml"))
        cp.kubectl("create", "clusterrolebinding", "bench", "--clusterrole=servegraph-operator", f"--user={USER}")
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "servegraph.cli",
            "run",
            "--health-address",
            f"127.0.0.1:{port}",
            "--workers",
            str(args.workers),
            # The registry listens on loopback, which the default source policy refuses.
            "--allowed-source-networks=127.0.0.0/8",
            # Only the measured namespaces: the floor loop's ServeGraphs must not be reconciled.
            *(f"--namespace=bench-{count}" for count in args.counts),
        ]
        op = cp.spawn("servegraph-operator", argv, identity=USER)
        op.wait_ready(lambda: http_probe(f"http://127.0.0.1:{port}/readyz"), timeout=60)
        await asyncio.sleep(2)
        assert op.pid is not None
        results["rss_idle_mib"] = rss_mib(op.pid)
        ca_pem = pki.ca_cert.read_text()
        async with api_client(cp) as api:
            total = 0
            for count in args.counts:
                ns = f"bench-{count}"
                await secrets(api, ns, ca_pem)
                names = [f"sg-{i:05d}" for i in range(count)]
                start, cpu0 = time.monotonic(), cpu_s(op.pid)
                apiserver_cpu0 = cpu_s(cp.pids["kube-apiserver"]) + cpu_s(cp.pids["etcd"])
                await create_servegraphs(api, ns, registry.url("g"), names, args.workers)
                await wait_applied(api, ns, count, within=1800)
                operator_s = time.monotonic() - start
                operator_cpu = cpu_s(op.pid) - cpu0
                server_cpu = cpu_s(cp.pids["kube-apiserver"]) + cpu_s(cp.pids["etcd"]) - apiserver_cpu0
                raw_ns = f"raw-{count}"
                await client.CoreV1Api(api).create_namespace({"metadata": {"name": raw_ns}})
                raw_s = await raw_apply(api, raw_ns, names, data, args.workers)
                floor_ns = f"floor-{count}"
                await secrets(api, floor_ns, ca_pem)
                one_sg = await client.CustomObjectsApi(api).get_namespaced_custom_object(
                    "servegraph.io", "v1alpha1", ns, "servegraphs", names[0]
                )
                floor_s = await raw_operator_writes(
                    api, floor_ns, names, registry.url("g"), data, one_sg["status"], args.workers
                )
                total += count
                results["counts"][count] = {
                    "operator_s": operator_s,
                    "operator_per_s": count / operator_s,
                    "raw_s": raw_s,
                    "raw_per_s": count / raw_s,
                    "ratio": raw_s / operator_s,
                    "floor_s": floor_s,
                    "floor_ratio": raw_s / floor_s,
                    "operator_vs_floor": floor_s / operator_s,
                    "operator_cpu_s": operator_cpu,
                    "apiserver_etcd_cpu_s": server_cpu,
                }
                print(json.dumps({count: results["counts"][count]}), flush=True)
            results["servegraphs"] = total
            results["rss_loaded_mib"] = rss_mib(op.pid)

            # latency of spec changes with every ServeGraph present
            big = f"bench-{max(args.counts)}"
            custom = client.CustomObjectsApi(api)
            latencies = []
            for i in range(args.changes):
                name = f"sg-{random.randrange(max(args.counts)):05d}"
                image = f"example.com/ray:{i}"
                start = time.monotonic()
                await custom.patch_namespaced_custom_object(
                    "servegraph.io", "v1alpha1", big, "servegraphs", name, {"spec": {"rayService": {"image": image}}},
                    _content_type="application/merge-patch+json",
                )  # fmt: skip
                while True:
                    rs = await custom.get_namespaced_custom_object("ray.io", "v1", big, "rayservices", name)
                    if (
                        rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
                        == image
                    ):
                        break
                    await asyncio.sleep(0.01)
                latencies.append(time.monotonic() - start)
            latencies.sort()
            results["latency_p50_s"] = statistics.median(latencies)
            results["latency_p99_s"] = latencies[int(0.99 * (len(latencies) - 1))]

            # steady state: nothing changes for quiet_s seconds
            await asyncio.sleep(5)
            mark = cp.audit_log.offset()
            await asyncio.sleep(args.quiet_s)
            events = cp.audit_log.events(user=USER, since=mark)
            minutes = args.quiet_s / 60
            results["steady_writes_per_min"] = sum(e["verb"] in WRITE_VERBS for e in events) / minutes
            verbs: dict[str, int] = {}
            for e in events:
                verbs[e["verb"]] = verbs.get(e["verb"], 0) + 1
            results["steady_requests_by_verb"] = verbs
            results["rss_after_mib"] = rss_mib(op.pid)
            async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/metrics") as r:
                results["metrics_sample"] = [
                    line for line in (await r.text()).splitlines() if line.startswith("servegraph_api_writes_total")
                ]
        await registry.stop()
        cp.unspawn(op)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--counts", default="100,500,1000", help="ServeGraphs per round (cumulative)")
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--quiet-s", type=float, default=60)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    args.counts = [int(c) for c in args.counts.split(",")]
    results = asyncio.run(main_async(args))
    results["machine"] = (
        f"{platform.machine()}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores"
    )
    results["python"] = platform.python_version()
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
