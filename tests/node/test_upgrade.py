"""Changes to the Ray cluster's spec, by KubeRay's own rules (RayService controller, v1.6.2 and v1.7.0 alike):

- worker groups appended at the end, everything else equal: KubeRay updates the running
  cluster in place (it hashes the spec without the new groups);
- any other change of the cluster spec (replicas and min/max excepted): a new pending
  cluster, traffic switched when all its applications are RUNNING.
"""

from __future__ import annotations

import asyncio
import json
import time

from node_support import (
    TEXT,
    LoadLoop,
    condition,
    deploy,
    figure,
    mini,
    servegraph,
    wait_ready,
    with_custom_resource,
    with_gpu_application,
)

from servegraph.v1 import graph_pb2
from servegraph_testbed.node.routes import answer
from servegraph_testbed.node.stack import Stack


async def _roll(
    stack: Stack, namespace: str, registry_name: str, v2: graph_pb2.Graph
) -> tuple[LoadLoop, list[str], float]:
    """Publish v2 under load; wait until v2's rollout is complete. (load, Ready reasons seen, t0)"""
    url = stack.serve_url(namespace, "mini", "/sentiment")
    reasons: list[str] = []
    async with LoadLoop(url, TEXT) as load:
        await load.until(lambda: len(load.results) >= 10, within=60, what="answers from v1")
        published = time.monotonic()
        await stack.publish(registry_name, v2.SerializeToString())
        await stack.post_published_event(registry_name)
        deadline = time.monotonic() + 420
        sg: dict = {}
        while time.monotonic() < deadline:
            sg = await servegraph(stack, namespace, "mini")
            ready = condition(sg, "Ready")
            if not reasons or reasons[-1] != ready.get("reason"):
                reasons.append(ready.get("reason", ""))
            rollout = sg["status"].get("rollout") or {}
            # Done when the rollout is: Ready alone may still be the previous version's.
            if rollout.get("version") == v2.version and rollout.get("phase") == "Serving":
                assert ready.get("status") == "True", ready
                break
            await asyncio.sleep(1)
        else:
            raise AssertionError(
                f"v2 not rolled out within 420 s; Ready reasons seen: {reasons}; status: {sg.get('status')}"
            )
        await asyncio.sleep(3)
    figure(f"{v2.version}: Ready reasons {reasons}; requests {load.summary(published)}")
    return load, reasons, published


def _active_cluster(stack: Stack, namespace: str) -> str:
    rs = stack.get("rayservice", namespace, "mini")
    assert rs is not None
    name: str = rs["status"]["activeServiceStatus"]["rayClusterName"]
    return name


async def test_an_appended_worker_group_is_added_to_the_running_cluster(stack: Stack, namespace: str) -> None:
    v1 = mini("1")
    # One image for every group (the default would pick a -gpu variant for a GPU graph).
    registry_name = await deploy(stack, namespace, "mini", v1, image=stack.cluster.images.ref("ray"))
    await wait_ready(stack, namespace, "mini")
    cluster = _active_cluster(stack, namespace)

    load, reasons, published = await _roll(stack, namespace, registry_name, with_gpu_application(v1, "2"))

    assert _active_cluster(stack, namespace) == cluster, "KubeRay updated the running cluster"
    assert "UpgradeInProgress" not in reasons, reasons
    assert load.failures == [], load.summary(published)
    pods = json.loads(stack.cp.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
    gpu = [p for p in pods if p["metadata"]["labels"].get("ray.io/group") == "gpu"]
    assert gpu and gpu[0]["metadata"]["labels"]["ray.io/cluster"] == cluster
    # The new application's first request, like the GPU sample's: sent again if lost.
    status, body = await answer(stack.serve_url(namespace, "mini", "/embed"), {"text": "a fine day"})
    assert status == 200 and len(body["embedding"]) == 4, body


async def test_a_changed_worker_group_goes_through_a_new_cluster_and_answers_continue(
    stack: Stack, namespace: str
) -> None:
    v1 = mini("1")
    registry_name = await deploy(stack, namespace, "mini", v1)
    await wait_ready(stack, namespace, "mini")
    old_cluster = _active_cluster(stack, namespace)

    load, reasons, published = await _roll(stack, namespace, registry_name, with_custom_resource(v1, "2"))

    new_cluster = _active_cluster(stack, namespace)
    assert new_cluster != old_cluster, "the CPU group's spec changed: KubeRay built a new cluster"
    # The status said so while it happened, and was not Ready for a version not yet serving.
    assert "UpgradeInProgress" in reasons, reasons
    assert load.failures == [], load.summary(published)
    rs = stack.get("rayservice", namespace, "mini")
    assert rs is not None
    (group,) = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert group["rayStartParams"]["resources"] == """'{"fast-disk": 1}'"""  # quoted for KubeRay's bash
    sg = await servegraph(stack, namespace, "mini")
    assert "upgrade" not in sg["status"], "the finished upgrade left the status"
