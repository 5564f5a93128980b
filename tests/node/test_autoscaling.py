"""Autoscaling seen working on a real node under the real KubeRay (issue 22, item 3).

A graph whose ingress autoscales 1 -> 4 replicas of 0.5 CPU (two per 1-CPU worker pod, so
a third replica needs a second pod) runs with KubeRay's in-tree autoscaler, whose sidecar
runs from our Ray image. Under a bounded load Ray Serve adds replicas and the autoscaler a
worker pod; after it both shrink back within the configured delays (Serve's
downscale_delay_s, the ServeGraph's idleTimeoutSeconds). A second application starts at
zero replicas and answers its first request from a cold start. Replica counts come from
Ray Serve itself (the head's dashboard through the API server's service proxy), pod counts
from the API server; every request must be answered.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from node_support import deploy, figure, wait_ready

from servegraph.v1 import graph_pb2
from servegraph_testbed.node.routes import answer, ask
from servegraph_testbed.node.stack import Stack

NAME = "autoscaled"
IDLE_TIMEOUT_S = 15
CONCURRENCY, DELAY_S, LOAD_FOR_S = 6, 0.5, 90.0
BACK_WITHIN_S = 240.0


def autoscaled_graph() -> graph_pb2.Graph:
    """`slow` (1 -> 4 replicas at 0.5 CPU, one ongoing request each) and `idle`, an echo
    that Ray Serve scales to zero (min_replicas 0) 5 s after its last request."""
    graph = graph_pb2.Graph(name=NAME, version="1", schema_version=1)
    slow = graph.applications.add(name="slow", route_prefix="/slow", ingress="slow").nodes["slow"]
    slow.deployment.import_path = "servegraph.examples:Slow"
    # Its own delay too: at the ingress Slow is handed the HTTP request, not the decoded payload.
    slow.deployment.kwargs["delay_s"].value.number_value = DELAY_S
    slow.resources.num_cpus = 0.5
    scaling = slow.scaling.autoscaling
    scaling.min_replicas, scaling.max_replicas = 1, 4
    scaling.target_ongoing_requests = 1
    scaling.upscale_delay_s, scaling.downscale_delay_s = 1, 5
    idle = graph.applications.add(name="idle", route_prefix="/idle", ingress="echo").nodes["echo"]
    idle.deployment.import_path = "servegraph.examples:Echo"
    idle.resources.num_cpus = 0.25  # fits beside one `slow` replica: a cold start needs no new pod
    zero = idle.scaling.autoscaling
    zero.min_replicas, zero.max_replicas = 0, 1
    zero.upscale_delay_s, zero.downscale_delay_s = 1, 5  # Serve scales to zero after downscale_delay_s
    return graph


def serve_replicas(stack: Stack, namespace: str, app: str, deployment: str) -> int:
    """RUNNING replicas of one deployment, as Ray Serve reports them on the head's dashboard."""
    path = f"/api/v1/namespaces/{namespace}/services/{NAME}-head-svc:dashboard/proxy/api/serve/applications/"
    doc = json.loads(stack.cp.kubectl("get", "--raw", path).stdout)
    dep = (((doc.get("applications") or {}).get(app) or {}).get("deployments") or {}).get(deployment) or {}
    return sum(1 for r in dep.get("replicas") or () if r.get("state") == "RUNNING")


def worker_pods(stack: Stack, namespace: str) -> int:
    """Ray worker pods Running (and not being deleted)."""
    out = stack.cp.kubectl("get", "pods", "-n", namespace, "-l", "ray.io/node-type=worker", "-o", "json")
    pods = json.loads(out.stdout)["items"]
    return sum(1 for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp"))


async def counted(stack: Stack, namespace: str, app: str, deployment: str) -> int | None:
    """`serve_replicas`, None while the dashboard or the proxy hiccups."""
    try:
        return await asyncio.to_thread(serve_replicas, stack, namespace, app, deployment)
    except Exception:
        return None


@dataclass
class Load:
    """`CONCURRENCY` clients POSTing back to back to one route; every outcome recorded."""

    url: str
    payload: Any
    statuses: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def client(self, session: aiohttp.ClientSession) -> None:
        while not self.stop.is_set():
            try:
                async with session.post(self.url, json=self.payload) as resp:
                    await resp.read()
                    self.statuses.append(resp.status)
                    if resp.status != 200:
                        self.errors.append(f"HTTP {resp.status}")
            except (aiohttp.ClientError, TimeoutError) as e:
                self.statuses.append(0)
                self.errors.append(repr(e))

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=60, sock_connect=5)
        connector = aiohttp.TCPConnector(limit=CONCURRENCY)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            await asyncio.gather(*(self.client(session) for _ in range(CONCURRENCY)))

    @property
    def failures(self) -> int:
        return sum(1 for s in self.statuses if s != 200)


async def until_count(
    what: str, read: Callable[[], Awaitable[int | None]], want: int, within: float, since: float | None = None
) -> float:
    """Seconds from `since` (default now) until `read()` returns `want`, bounded by `within` from now."""
    deadline = time.monotonic() + within
    since = time.monotonic() if since is None else since
    last = None
    while time.monotonic() < deadline:
        last = await read()
        if last == want:
            return time.monotonic() - since
        await asyncio.sleep(2)
    raise AssertionError(f"{what}: not {want} within {within:.0f} s (last seen {last})")


async def test_replicas_and_worker_pods_grow_under_load_and_shrink_after_it(stack: Stack, namespace: str) -> None:
    await deploy(stack, namespace, NAME, autoscaled_graph(), autoscaler={"idleTimeoutSeconds": IDLE_TIMEOUT_S})
    await wait_ready(stack, namespace, NAME, within=480)

    # What was rendered and what KubeRay built from it: the sidecar runs from our Ray image.
    rs = stack.get("rayservice", namespace, NAME)
    assert rs is not None
    cluster = rs["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["autoscalerOptions"]["idleTimeoutSeconds"] == IDLE_TIMEOUT_S
    (group,) = cluster["workerGroupSpecs"]
    minimum = group["minReplicas"]
    # 1 x 0.5 CPU at the minimum, 4 x 0.5 + 1 x 0.25 at most, in 1-CPU workers.
    assert (minimum, group["replicas"], group["maxReplicas"]) == (1, 1, 3), group
    heads = json.loads(
        stack.cp.kubectl("get", "pods", "-n", namespace, "-l", "ray.io/node-type=head", "-o", "json").stdout
    )
    (head,) = heads["items"]
    images = {c["name"]: c["image"] for c in head["spec"]["containers"]}
    assert images["autoscaler"] == images["ray-head"] == cluster["autoscalerOptions"]["image"], images

    async def slow() -> int | None:
        return await counted(stack, namespace, "slow", "slow")

    async def idle() -> int | None:
        return await counted(stack, namespace, "idle", "echo")

    async def workers() -> int:
        return await asyncio.to_thread(worker_pods, stack, namespace)

    await until_count("slow replicas at Ready", slow, 1, within=60)
    assert await workers() == minimum
    await until_count("idle replicas at Ready", idle, 0, within=60)

    url = stack.serve_url(namespace, NAME, "/slow")
    payload = {"delay_s": DELAY_S}
    status, body = await answer(url, payload)  # the first: resent if lost on its way
    assert status == 200 and body["payload"] == payload, body

    # The load, bounded: until both a replica and a worker pod were added (and 5 s more), or LOAD_FOR_S.
    load = Load(url, payload)
    started = time.monotonic()
    running = asyncio.create_task(load.run())
    first_replica: float | None = None
    first_pod: float | None = None
    peak_replicas, peak_pods = 1, minimum
    while time.monotonic() - started < LOAD_FOR_S:
        replicas, pods = await slow(), await workers()
        now = time.monotonic() - started
        if replicas is not None and replicas > 1 and first_replica is None:
            first_replica = now
        if pods > minimum and first_pod is None:
            first_pod = now
        peak_replicas, peak_pods = max(peak_replicas, replicas or 0), max(peak_pods, pods)
        if first_replica is not None and first_pod is not None and now > max(first_replica, first_pod) + 5:
            break
        await asyncio.sleep(1)
    load.stop.set()
    await asyncio.wait_for(running, timeout=90)
    stopped = time.monotonic()
    requests = len(load.statuses)
    assert load.failures == 0, f"{load.failures} of {requests} requests failed: {load.errors[:5]}"
    assert first_replica is not None, f"no replica added in {LOAD_FOR_S:.0f} s of load ({requests} requests)"
    assert first_pod is not None, f"no worker pod added in {LOAD_FOR_S:.0f} s of load (peak {peak_replicas} replicas)"

    # After the load: Serve's downscale_delay_s (5 s), then the autoscaler's idle timeout
    # (IDLE_TIMEOUT_S), then the pod's termination grace (30 s).
    replicas_back = await until_count("slow replicas after the load", slow, 1, BACK_WITHIN_S, stopped)
    pods_back = await until_count("worker pods after the load", workers, minimum, BACK_WITHIN_S, stopped)
    status, _ = await ask(url, payload)
    assert status == 200, "the route answers at the minimum again"

    figure(
        f"autoscaling ({CONCURRENCY} concurrent requests of {DELAY_S} s, {requests} answered, 0 failed): "
        f"load -> first added replica {first_replica:.1f} s, -> first added worker pod {first_pod:.1f} s "
        f"(peak {peak_replicas} replicas, {peak_pods} workers); load stopped -> replicas back to 1 "
        f"{replicas_back:.1f} s, -> worker pods back to {minimum} {pods_back:.1f} s (idleTimeoutSeconds {IDLE_TIMEOUT_S})"
    )

    # Scale to zero: `idle` has no replica; its first request waits for one to start.
    await until_count("idle replicas before the cold start", idle, 0, within=60)
    sent = time.monotonic()
    status, body = await ask(stack.serve_url(namespace, NAME, "/idle"), {"cold": True}, limit_s=180)
    cold = time.monotonic() - sent
    assert status == 200 and body["payload"] == {"cold": True}, body
    assert await idle() == 1
    again = await until_count("idle replicas after its request", idle, 0, within=120)
    figure(f"scale to zero: cold start (first request's latency) {cold:.1f} s; back to 0 replicas {again:.1f} s later")
