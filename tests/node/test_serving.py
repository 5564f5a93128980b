"""A published graph answers real requests under the real KubeRay, and updates in place."""

from __future__ import annotations

import asyncio
import time

from node_support import TEXT, LoadLoop, condition, deploy, figure, mini, wait_ready

from servegraph_testbed.node.routes import answer, ask
from servegraph_testbed.node.stack import Stack


async def test_servegraph_becomes_ready_from_kuberay_and_its_route_answers(stack: Stack, namespace: str) -> None:
    await deploy(stack, namespace, "mini", mini("1"))
    sg = await wait_ready(stack, namespace, "mini")

    # Ready is ours, computed from what KubeRay itself reports on the RayService.
    rs = stack.get("rayservice", namespace, "mini")
    assert rs is not None
    kuberay_ready = [c for c in rs["status"]["conditions"] if c["type"] == "Ready"]
    assert kuberay_ready and kuberay_ready[0]["status"] == "True", rs["status"]
    apps = rs["status"]["activeServiceStatus"]["applicationStatuses"]
    assert apps["sentiment"]["status"] == "RUNNING"
    assert sg["status"]["applications"]["sentiment"]["status"] == "RUNNING"
    assert sg["status"]["graph"]["version"] == "1"
    assert condition(sg, "Ready")["reason"] == "AllApplicationsRunning"

    # A real answer, through KubeRay's serve Service and kube-proxy.
    url = stack.serve_url(namespace, "mini", "/sentiment")
    status, body = await answer(url, {"text": "a great and good day"})  # the first: resent if lost
    assert (status, body) == (200, {"label": "positive", "score": 1.0})
    status, body = await ask(url, {"text": "an awful, boring day"})
    assert (status, body) == (200, {"label": "negative", "score": -1.0})


async def test_a_serve_only_change_is_served_in_place_without_failed_requests(stack: Stack, namespace: str) -> None:
    registry_name = await deploy(stack, namespace, "mini", mini("1"))
    await wait_ready(stack, namespace, "mini")
    cluster_before = stack.get("rayservice", namespace, "mini")["status"]["activeServiceStatus"]["rayClusterName"]
    pods_before = _pod_uids(stack, namespace)
    url = stack.serve_url(namespace, "mini", "/sentiment")

    async with LoadLoop(url, TEXT) as load:
        await load.until(lambda: len(load.results) >= 20, within=60, what="20 answers from v1")
        published = time.monotonic()
        await stack.publish(registry_name, mini("2", positive=["fine"]).SerializeToString())
        await stack.post_published_event(registry_name)
        await load.until(
            lambda: load.answers(lambda b: b.get("label"))[-1:] == ["positive"], within=180, what="v2's answer"
        )
        took = time.monotonic() - published
        await asyncio.sleep(5)  # keep the load on after the switch

    figure(f"serve-only change in place: publish -> new answer {took:.1f} s; requests {load.summary(published)}")

    assert load.answers(lambda b: b["label"]) == ["neutral", "positive"]
    assert load.failures == [], f"{len(load.failures)} of {len(load.results)} requests failed: {load.failures[:5]}"
    sg = await wait_ready(stack, namespace, "mini")
    assert sg["status"]["graph"]["version"] == "2"
    rs = stack.get("rayservice", namespace, "mini")
    assert rs["status"]["activeServiceStatus"]["rayClusterName"] == cluster_before, "served in place"
    assert _pod_uids(stack, namespace) == pods_before, "no Ray pod was restarted"


def _pod_uids(stack: Stack, namespace: str) -> dict[str, str]:
    import json

    pods = json.loads(stack.cp.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}
