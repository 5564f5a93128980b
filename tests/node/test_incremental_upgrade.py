"""KubeRay 1.7's incremental upgrade through a real Gateway (Traefik), under load.

`upgradeStrategy: NewClusterWithIncrementalUpgrade` makes KubeRay create a Gateway of the
named class and an HTTPRoute with one backend per cluster (its per-cluster serve Services).
On a cluster-changing publish it starts the new cluster with Serve's `target_capacity` 0,
raises it by `maxSurgePercent`, moves `stepSizePercent` of the HTTPRoute's weight to it every
`intervalSeconds` up to that capacity, lowers the old cluster's capacity, and so on until
the new cluster has 100 % of the traffic and the old one 0 % of its capacity
(rayservice_controller.go: calculateTrafficRoutedPercent, reconcileServeTargetCapacity).

The raw mechanism, seen from outside: the requests go to the Gateway's address (Traefik's
Service), every answer is checked, and the RayService, the HTTPRoute, the Ray pods and the
ServeGraph's own status are sampled every second. servegraph renders every worker group with
`minReplicas: 0` for this type, so each cluster holds only the workers its Serve replicas need
at its target capacity (render/rayservice.py). Then a version that fails on its new cluster is
rolled back by servegraph, KubeRay drops that cluster, and the history says so.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from node_support import (
    TEXT,
    LoadLoop,
    deploy,
    figure,
    mini,
    servegraph,
    wait_ready,
    wait_rolled_out,
    with_custom_resource,
)

from servegraph.v1 import graph_pb2
from servegraph_testbed.node.gateway import CONTROLLER_NAME, GATEWAY_CLASS
from servegraph_testbed.node.routes import ask
from servegraph_testbed.node.stack import Stack
from servegraph_testbed.rest import ApiError
from servegraph_testbed.waiting import eventually

MAX_SURGE, STEP, INTERVAL = 50, 25, 10
pytestmark = pytest.mark.timeout(1800)  # its waits (and the first test's module setup) pass 600 s under load
UPGRADE = {
    "upgradeStrategy": "NewClusterWithIncrementalUpgrade",
    "clusterUpgradeOptions": {
        "gatewayClassName": GATEWAY_CLASS,
        "maxSurgePercent": MAX_SURGE,
        "stepSizePercent": STEP,
        "intervalSeconds": INTERVAL,
    },
    # An old cluster's worker left without replicas goes soon (KubeRay's default: 60 s).
    "autoscaler": {"idleTimeoutSeconds": 10},
}
# Two workers per cluster at full capacity (1 logical CPU each): two sentiment replicas of
# 0.5 CPU and the tokenizer's 0.25; half the capacity fits one.
SENTIMENT_REPLICAS, SENTIMENT_CPUS = 2, 0.5
WORKERS = {"resources": {"requests": {"cpu": "150m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "3Gi"}}}
GATEWAY_PATH = "/apis/gateway.networking.k8s.io/v1/namespaces/{ns}/{kind}/{name}"


def _graph(version: str, positive: list[Any] | None = None, tokenizer: str | None = None) -> graph_pb2.Graph:
    graph = mini(version, positive=positive, tokenizer=tokenizer, replicas=SENTIMENT_REPLICAS)
    graph.applications[0].nodes["sentiment"].resources.num_cpus = SENTIMENT_CPUS
    return graph


@dataclass
class Sample:
    at: float
    active: tuple[str, int | None, int | None]  # cluster, targetCapacity, trafficRoutedPercent
    pending: tuple[str, int | None, int | None]
    weights: dict[str, int]  # HTTPRoute backend (serve Service) → weight
    pods: dict[str, int]  # Ray cluster → its pods (not being deleted)
    upgrade: dict[str, Any]  # the ServeGraph's status.upgrade (servegraph's mirror), {} without one
    ready: str  # the ServeGraph's Ready: "reason: message"


@dataclass
class Sampler:
    """The RayService's two service statuses, the HTTPRoute's weights and the Ray pods, every second."""

    stack: Stack
    namespace: str
    name: str
    samples: list[Sample] = field(default_factory=list)
    missed: list[str] = field(default_factory=list)  # reads that failed: a gap, not the end of sampling
    _task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Sampler:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    async def _run(self) -> None:
        while True:
            try:
                self.samples.append(await asyncio.to_thread(self.sample))
            except (ApiError, OSError, KeyError) as e:
                self.missed.append(repr(e))
            await asyncio.sleep(1)

    def sample(self) -> Sample:
        rest, ns = self.stack.cp.rest(), self.namespace
        rs = rest.get(f"/apis/ray.io/v1/namespaces/{ns}/rayservices/{self.name}")
        status = rs.get("status") or {}

        def side(key: str) -> tuple[str, int | None, int | None]:
            s = status.get(key) or {}
            return s.get("rayClusterName", ""), s.get("targetCapacity"), s.get("trafficRoutedPercent")

        weights: dict[str, int] = {}
        try:
            route = rest.get(GATEWAY_PATH.format(ns=ns, kind="httproutes", name=f"{self.name}-httproute"))
            for ref in route["spec"]["rules"][0]["backendRefs"]:
                weights[ref["name"]] = ref.get("weight", 1)
        except ApiError as e:
            if e.status != 404:
                raise
        pods: dict[str, int] = {}
        for pod in rest.get(f"/api/v1/namespaces/{ns}/pods?labelSelector=ray.io/cluster")["items"]:
            if not pod["metadata"].get("deletionTimestamp"):
                cluster = pod["metadata"]["labels"]["ray.io/cluster"]
                pods[cluster] = pods.get(cluster, 0) + 1
        sg = rest.get(f"/apis/servegraph.io/v1alpha1/namespaces/{ns}/servegraphs/{self.name}")
        sg_status = sg.get("status") or {}
        ready = next((c for c in sg_status.get("conditions") or [] if c["type"] == "Ready"), {})
        return Sample(
            time.monotonic(),
            side("activeServiceStatus"),
            side("pendingServiceStatus"),
            weights,
            pods,
            dict(sg_status.get("upgrade") or {}),
            f"{ready.get('reason')}: {ready.get('message')}",
        )


async def _programmed(stack: Stack, namespace: str, name: str) -> str:
    """KubeRay's Gateway Accepted and Programmed by Traefik, and its HTTPRoute accepted with its
    backends resolved; returns the Gateway's address (Traefik's Service)."""
    rest = stack.cp.rest()

    async def ready() -> str | None:
        gw = await asyncio.to_thread(
            rest.get, GATEWAY_PATH.format(ns=namespace, kind="gateways", name=f"{name}-gateway")
        )
        assert gw["spec"]["gatewayClassName"] == GATEWAY_CLASS, gw["spec"]
        conditions = {c["type"]: c["status"] for c in (gw.get("status") or {}).get("conditions") or []}
        route = await asyncio.to_thread(
            rest.get, GATEWAY_PATH.format(ns=namespace, kind="httproutes", name=f"{name}-httproute")
        )
        parents = (route.get("status") or {}).get("parents") or []
        ours = [p for p in parents if p["controllerName"] == CONTROLLER_NAME]
        route_ok = ours and all(
            {c["type"]: c["status"] for c in p["conditions"]}.items()
            >= {("Accepted", "True"), ("ResolvedRefs", "True")}
            for p in ours
        )
        if conditions.get("Accepted") == conditions.get("Programmed") == "True" and route_ok:
            (address,) = gw["status"]["addresses"]
            return str(address["value"])
        return None

    return await eventually(ready, within=120, interval=1, what="KubeRay's Gateway and HTTPRoute programmed by Traefik")


def _pending_routed(sample: Sample) -> int | None:
    """The new cluster's share of the requests as the ServeGraph's status says it."""
    return ((sample.upgrade.get("incremental") or {}).get("pending") or {}).get("trafficRoutedPercent")


async def _servegraph_status(stack: Stack, namespace: str, name: str) -> str:
    command = [sys.executable, "-m", "servegraph.cli", "status", name, "-n", namespace]
    command += ["--kubeconfig", str(stack.cp.kubeconfig())]
    out = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


async def test_an_incremental_upgrade_moves_the_traffic_through_the_gateway_in_steps(
    stack: Stack, namespace: str
) -> None:
    started = time.monotonic()
    registry_name = await deploy(stack, namespace, "mini", _graph("1"), workers=WORKERS, **UPGRADE)
    await wait_ready(stack, namespace, "mini")
    address = await _programmed(stack, namespace, "mini")
    programmed = time.monotonic()
    assert address == stack.net.gateway_ip, "Traefik reports its Service as the Gateway's address"
    url = f"http://{address}:80/sentiment"
    # Traefik writes Programmed and the route's Accepted before its provider's throttled load of
    # the new configuration (2 s by default), so the route can answer Traefik's own 404 for a
    # moment after them (seen once in a cold `make test`). The load starts once it has answered.
    early: list[int] = []

    async def routed() -> bool:
        try:
            status, _ = await ask(url, TEXT)
        except (aiohttp.ClientError, TimeoutError):
            status = 0
        if status != 200:
            early.append(status)
        return status == 200

    await eventually(routed, within=60, interval=0.5, what="a first answer through the Gateway")
    routed_after = time.monotonic() - programmed
    rs = await asyncio.to_thread(stack.get, "rayservice", namespace, "mini")
    assert rs is not None
    groups = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert [(g["minReplicas"], g["replicas"]) for g in groups] == [(0, 2)], groups

    async with Sampler(stack, namespace, "mini") as sampler, LoadLoop(url, TEXT) as load:
        await load.until(lambda: len(load.results) >= 10, within=60, what="answers from v1 through the Gateway")
        old = sampler.sample().active[0]
        baseline = sum(sampler.sample().pods.values())
        published = time.monotonic()
        # A cluster change (the tokenizer needs a custom resource) and a Serve change ("fine"
        # is positive): every answer says which cluster gave it.
        v2 = with_custom_resource(_graph("2", positive=["fine"]), "2")
        await stack.publish(registry_name, v2.SerializeToString())
        await stack.post_published_event(registry_name)

        async def quarter() -> bool:
            return bool(sampler.samples) and _pending_routed(sampler.samples[-1]) == STEP

        await eventually(quarter, within=600, interval=0.5, what=f"the ServeGraph's status at {STEP} %")
        shown = await _servegraph_status(stack, namespace, "mini")

        async def promoted() -> bool:
            last = sampler.samples[-1] if sampler.samples else None
            return last is not None and last.active[0] not in ("", old) and not last.pending[0]

        await eventually(promoted, within=900, interval=1, what="the new cluster promoted")
        done = time.monotonic()
        await load.until(lambda: load.results[-1][0] > done + 3, within=30, what="answers after the promotion")
        upgraded = len(load.results)
        await wait_rolled_out(stack, namespace, "mini", "2", within=120)

        # v3 changes the cluster again (no custom resource) and its tokenizer cannot be imported:
        # its new cluster never serves; servegraph rolls back to v2, and KubeRay drops it.
        failed_at = time.monotonic()
        v3 = _graph("3", positive=["fine"], tokenizer="servegraph.examples:NoSuchTokenizer")
        await stack.publish(registry_name, v3.SerializeToString())
        await stack.post_published_event(registry_name)

        async def rolled_back() -> dict[str, Any] | None:
            sg = await servegraph(stack, namespace, "mini")
            history = {h["version"]: h for h in (sg.get("status") or {}).get("history") or []}
            cluster = history.get("3", {}).get("rayCluster") or {}
            rollout = (sg.get("status") or {}).get("rollout") or {}
            back = (rollout.get("version"), rollout.get("phase")) == ("2", "Serving")
            return sg if back and cluster.get("outcome") == "RolledBack" else None

        sg = await eventually(rolled_back, within=600, interval=1, what="v3's cluster rolled back, v2 Serving")
        rollback_took = time.monotonic() - failed_at
        await load.until(lambda: load.results[-1][0] > time.monotonic() - 1, within=30, what="answers after it")

    new = [s for s in sampler.samples if s.at <= done][-1].active[0]
    assert load.failures == [], load.summary(published)
    labels = [body["label"] for _, status, body in load.results if status == 200]
    assert set(labels) == {"neutral", "positive"}, load.summary(published)
    assert labels[0] == "neutral" and labels[upgraded - 1 :] == ["positive"] * (len(labels) - upgraded + 1)

    # The new cluster's share of the HTTPRoute, in the steps asked for, and KubeRay's status with it.
    during = [s for s in sampler.samples if s.at <= done]
    shares = [(w, at) for w, at in _firsts(during, lambda s: s.weights.get(f"{new}-serve-svc")) if w is not None]
    assert [w for w, _ in shares] == list(range(0, 101, STEP)), shares
    routed = [p for p, _ in _firsts(during, lambda s: s.pending[2]) if p is not None]
    assert routed == list(range(0, 101, STEP)), routed
    pending_capacity = [c for c, _ in _firsts(during, lambda s: s.pending[1]) if c is not None]
    active_capacity = [c for c, _ in _firsts(during, lambda s: s.active[1] if s.active[0] == old else None) if c]
    assert pending_capacity == list(range(0, 101, MAX_SURGE)), pending_capacity
    # The old cluster's last step (to 0) and the promotion can share one status write.
    assert active_capacity[:2] == [100, 100 - MAX_SURGE], active_capacity
    gaps = [round(b - a, 1) for (_, a), (_, b) in itertools.pairwise(shares[1:])]
    assert all(g >= INTERVAL - 1.5 for g in gaps), f"steps closer than intervalSeconds: {gaps}"

    # servegraph's status said the split as it moved: the steps in order (a step may fall between
    # two status writes), Ready naming both clusters, and `servegraph status` one line per cluster.
    mirrored = [p for p, _ in _firsts(during, _pending_routed) if p is not None]
    assert STEP in mirrored and mirrored == sorted(mirrored) and set(mirrored) <= set(routed), mirrored
    said = f"UpgradeInProgress: KubeRay moves the requests in steps: {STEP} % to Ray cluster {new}"
    assert any(s.ready.startswith(said) for s in during), {s.ready for s in during}
    assert f"Upgrade:       Ray cluster {new} (sentiment: RUNNING); incremental, from {old}\n" in shown, shown
    assert f"  {new}: {STEP} % of requests, target capacity {MAX_SURGE} %" in shown, shown

    # The pods: the new cluster starts from no worker (minReplicas 0) and gets workers as Ray
    # Serve's target_capacity on it rises: up to its first capacity step, a new head and the
    # workers of maxSurgePercent of the replicas, not a second full cluster. At the last step
    # KubeRay raises the new cluster to 100 % right after lowering the old one, whose freed
    # workers go only after idleTimeoutSeconds: the peak comes then, for that long.
    peak = max(sum(s.pods.values()) for s in during)
    workers = baseline - 1
    bound = baseline + 1 + math.ceil(workers * MAX_SURGE / 100)
    full_at = next(s.at for s in during if s.pending[1] == 100)
    before_full = max(sum(s.pods.values()) for s in during if s.at < full_at)
    extra = sum(max(0, sum(s.pods.values()) - baseline) * (b.at - s.at) for s, b in itertools.pairwise(during))
    timeline = ", ".join(f"{n} at +{at - published:.0f} s" for n, at in _firsts(during, lambda s: sum(s.pods.values())))

    history = {h["version"]: h for h in sg["status"]["history"]}
    assert history["3"]["outcome"] == "RolledBack" and history["3"]["rayCluster"]["outcome"] == "RolledBack"
    assert history["2"]["rayCluster"] == {"name": new, "outcome": "Promoted", "peakTrafficPercent": 100}, history
    events = stack.cp.kubectl("get", "events", "-n", namespace, "--field-selector", "reason=ClusterRolledBack")
    assert f"Ray cluster {history['3']['rayCluster']['name']} of version '3'" in events.stdout, events.stdout
    figure(
        f"incremental upgrade (maxSurge {MAX_SURGE} %, step {STEP} % every {INTERVAL} s): "
        f"promoted {done - published:.0f} s after the publish; new cluster's weight "
        + ", ".join(f"{w} % at +{at - published:.0f} s" for w, at in shares)
        + f"; Ray pods {baseline} before, {before_full} until the new cluster's capacity reached 100 % at "
        f"+{full_at - published:.0f} s (bound {bound}), peak {peak}: {timeline}; {extra:.0f} extra pod-seconds; "
        f"servegraph's status at {mirrored} %; pending capacity {pending_capacity}, old cluster's "
        f"{active_capacity}; a version failing on its new cluster rolled back in {rollback_took:.0f} s "
        f"(Ray cluster {history['3']['rayCluster']['name']}); {len(load.results)} requests through the "
        f"Gateway, {len(load.failures)} failed (the route's first 200 {routed_after:.1f} s after Programmed, "
        f"before it: {early or 'none'}); test {time.monotonic() - started:.0f} s"
    )
    assert before_full <= bound, f"Ray pods {baseline} before, {before_full} over {bound} before 100 %: {timeline}"


def _firsts(samples: list[Sample], key: Any) -> Iterator[tuple[Any, float]]:
    """Each distinct value of `key(sample)` with the time it was first seen, in order."""
    last: Any = object()
    for s in samples:
        value = key(s)
        if value != last:
            yield value, s.at
            last = value
