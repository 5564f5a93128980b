"""Suspend, resume and restart on a real node: Ray pods go and come back, requests counted.

- `spec.suspend: true` sets KubeRay 1.7's own `spec.suspend` on the RayService: KubeRay
  removes its Ray cluster and the pods go, the RayService stays (Suspended); the ServeGraph
  stays with its status and history. `false` runs the same version again on a new cluster.
- `servegraph restart` rolls the Ray cluster: KubeRay builds a new one beside the running
  one and moves traffic when it is Ready, and not one request fails meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

from node_support import TEXT, LoadLoop, condition, deploy, figure, mini, servegraph, wait_ready, wait_rolled_out

from servegraph.names import RESTARTED_AT_ANNOTATION
from servegraph_testbed.node.routes import answer
from servegraph_testbed.node.stack import Stack
from servegraph_testbed.waiting import eventually

DELETION_DELAY_S = 15


def _ray_pods(stack: Stack, namespace: str) -> dict[str, str]:
    """name → uid of the Ray pods (KubeRay labels every one with its cluster)."""
    out = stack.cp.kubectl("get", "pods", "-n", namespace, "-l", "ray.io/cluster", "-o", "json")
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in json.loads(out.stdout)["items"]}


def _active_cluster(stack: Stack, namespace: str) -> str:
    rs = stack.get("rayservice", namespace, "mini")
    assert rs is not None
    return str(((rs.get("status") or {}).get("activeServiceStatus") or {}).get("rayClusterName") or "")


def _patch(stack: Stack, namespace: str, patch: dict[str, Any]) -> None:
    stack.cp.kubectl("patch", "servegraph", "mini", "-n", namespace, "--type", "merge", "-p", json.dumps(patch))


async def test_suspend_removes_the_ray_cluster_and_resume_serves_the_same_version(stack: Stack, namespace: str) -> None:
    await deploy(stack, namespace, "mini", mini("1"))
    await wait_ready(stack, namespace, "mini")
    before = (await wait_rolled_out(stack, namespace, "mini", "1"))["status"]  # history settled
    url = stack.serve_url(namespace, "mini", "/sentiment")
    async with LoadLoop(url, TEXT) as load:
        await load.until(lambda: len(load.results) >= 10, within=60, what="10 answers before the suspend")
    assert load.failures == [], load.summary(load.results[0][0])
    assert _ray_pods(stack, namespace), "Ray pods run before the suspend"

    suspended = time.monotonic()
    await asyncio.to_thread(_patch, stack, namespace, {"spec": {"suspend": True}})

    async def cluster_gone() -> bool:
        rs = await asyncio.to_thread(stack.get, "rayservice", namespace, "mini")
        assert rs is not None, "KubeRay 1.7's suspend keeps the RayService"
        said = {c["type"]: c["status"] for c in (rs.get("status") or {}).get("conditions") or []}
        return said.get("Suspended") == "True" and not await asyncio.to_thread(_ray_pods, stack, namespace)

    await eventually(cluster_gone, within=180, interval=1, what="KubeRay Suspended and every Ray pod gone")
    gone_after = time.monotonic() - suspended
    kept = await asyncio.to_thread(stack.get, "rayservice", namespace, "mini")
    assert kept is not None and kept["spec"]["suspend"] is True
    sg = await servegraph(stack, namespace, "mini")
    ready = condition(sg, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Suspended"), ready
    assert condition(sg, "Progressing")["reason"] == "Suspended"
    assert sg["status"]["graph"] == before["graph"], "the version is still shown"
    assert sg["status"]["history"] == before["history"], "the history is kept"
    assert "applications" not in sg["status"]
    assert condition(sg, "Applied")["message"].startswith("RayService mini has spec.suspend: KubeRay del"), sg
    rayclusters = stack.cp.kubectl("get", "rayclusters", "-n", namespace, "-o", "name").stdout.strip()
    assert rayclusters == "", rayclusters

    resumed = time.monotonic()
    await asyncio.to_thread(_patch, stack, namespace, {"spec": {"suspend": False}})
    sg = await wait_ready(stack, namespace, "mini", within=420)
    ready_after = time.monotonic() - resumed
    assert sg["status"]["graph"] == before["graph"], "the same version runs again"
    assert sg["status"]["history"] == before["history"], "a resume is no new rollout"
    lost: list[str] = []
    url = stack.serve_url(namespace, "mini", "/sentiment")
    status, body = await answer(url, {"text": "a great and good day"}, lost=lost)
    assert (status, body) == (200, {"label": "positive", "score": 1.0})
    answered_after = time.monotonic() - resumed
    async with LoadLoop(url, TEXT) as load:
        await load.until(lambda: len(load.results) >= 10, within=60, what="10 answers after the resume")
    assert load.failures == [], load.summary(resumed)

    figure(
        f"suspend (KubeRay's spec.suspend) -> Suspended and Ray pods gone {gone_after:.1f} s; resume -> Ready {ready_after:.1f} s, "
        f"-> first answer {answered_after:.1f} s (lost on the way: {lost or 'none'})"
    )


async def test_restart_builds_a_new_ray_cluster_with_no_failed_request(stack: Stack, namespace: str) -> None:
    # The old cluster goes 15 s after the switch, not KubeRay's default 60 (the load below has
    # stopped by then): the spec field reaches KubeRay, and the old pods' minute is not paid.
    await deploy(stack, namespace, "mini", mini("1"), rayClusterDeletionDelaySeconds=DELETION_DELAY_S)
    await wait_ready(stack, namespace, "mini")
    # The rollout's outcome turns Serving after Ready: compare the history from then on.
    before = (await wait_rolled_out(stack, namespace, "mini", "1"))["status"]
    old_cluster = _active_cluster(stack, namespace)
    old_pods = _ray_pods(stack, namespace)
    url = stack.serve_url(namespace, "mini", "/sentiment")

    reasons: list[str] = []
    async with LoadLoop(url, TEXT) as load:
        await load.until(lambda: len(load.results) >= 10, within=60, what="answers before the restart")
        started = time.monotonic()
        result = await asyncio.to_thread(_restart, stack, namespace)
        assert result.returncode == 0, result.stderr
        deadline = time.monotonic() + 420
        while True:
            sg = await servegraph(stack, namespace, "mini")
            ready = condition(sg, "Ready")
            if not reasons or reasons[-1] != ready.get("reason"):
                reasons.append(ready.get("reason", ""))
            new_cluster = await asyncio.to_thread(_active_cluster, stack, namespace)
            if new_cluster != old_cluster and ready.get("status") == "True":
                break
            assert time.monotonic() < deadline, f"no new cluster serving in 420 s; Ready reasons seen: {reasons}"
            await asyncio.sleep(1)
        switched = time.monotonic()
        switched_after = switched - started
        await asyncio.sleep(5)  # keep the load on after the switch

    assert load.failures == [], f"{len(load.failures)} of {len(load.results)} failed: {load.summary(started)}"
    assert "UpgradeInProgress" in reasons, reasons
    rs = stack.get("rayservice", namespace, "mini")
    assert rs is not None
    assert rs["spec"]["rayClusterDeletionDelaySeconds"] == DELETION_DELAY_S
    value = sg["metadata"]["annotations"][RESTARTED_AT_ANNOTATION]
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    assert head["metadata"]["annotations"][RESTARTED_AT_ANNOTATION] == value

    async def old_pods_gone() -> bool:
        pods = await asyncio.to_thread(_ray_pods, stack, namespace)
        return bool(pods) and not set(pods.values()) & set(old_pods.values())

    # Within 75 s of the switch: the delay, then the pods' 30 s grace (a Ray container's shell
    # does not pass SIGTERM on). KubeRay's default delay would make it over 90 s.
    within = 75 - (time.monotonic() - switched)
    await eventually(old_pods_gone, within=within, interval=1, what="the old cluster's pods removed by KubeRay")
    figure(
        f"restart -> new Ray cluster serving {switched_after:.1f} s; Ready reasons {reasons}; "
        f"requests {load.summary(started)}; old cluster's pods gone {time.monotonic() - switched:.1f} s after the "
        f"switch (rayClusterDeletionDelaySeconds {DELETION_DELAY_S})"
    )
    sg = await servegraph(stack, namespace, "mini")
    # the same version serves, its history entry naming the cluster the restart built
    history = [dict(h) for h in sg["status"]["history"]]
    assert history[0].pop("rayCluster", None) == {"name": new_cluster, "outcome": "Promoted"}, sg["status"]["history"]
    assert sg["status"]["graph"] == before["graph"] and history == before["history"]


def _restart(stack: Stack, namespace: str) -> subprocess.CompletedProcess[str]:
    """`servegraph restart` as a user runs it, with the admin's kubeconfig."""
    kubeconfig = str(stack.cp.kubeconfig())
    return subprocess.run(
        [sys.executable, "-m", "servegraph.cli", "restart", "mini", "-n", namespace, "--kubeconfig", kubeconfig],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
