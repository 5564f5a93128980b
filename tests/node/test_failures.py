"""A graph that fails at runtime, and a deleted ServeGraph, on the real node."""

from __future__ import annotations

import asyncio
import json
import time

from node_support import TEXT, LoadLoop, condition, deploy, figure, mini, servegraph, wait_ready

from servegraph.operator.rollout.store import store_name
from servegraph_testbed.node.stack import Stack
from servegraph_testbed.waiting import eventually


async def _wait_app_failed(stack: Stack, namespace: str, within: float = 300) -> dict:
    async def failed() -> dict | None:
        sg = await servegraph(stack, namespace, "mini")
        app = ((sg.get("status") or {}).get("applications") or {}).get("sentiment") or {}
        return sg if app.get("status") in ("DEPLOY_FAILED", "UNHEALTHY") else None

    return await eventually(failed, within=within, interval=1, what="application sentiment failed")


async def test_import_failure_names_app_and_node_and_the_old_version_keeps_serving(
    stack: Stack, namespace: str
) -> None:
    registry_name = await deploy(stack, namespace, "mini", mini("1"))
    await wait_ready(stack, namespace, "mini")
    url = stack.serve_url(namespace, "mini", "/sentiment")

    async with LoadLoop(url, TEXT) as load:
        await stack.publish(
            registry_name, mini("2", tokenizer="servegraph.examples:NoSuchTokenizer").SerializeToString()
        )
        await stack.post_published_event(registry_name)
        sg = await _wait_app_failed(stack, namespace)
        await asyncio.sleep(5)

    ready = condition(sg, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "ApplicationsNotRunning", ready
    assert "sentiment: DEPLOY_FAILED" in ready["message"]
    app = sg["status"]["applications"]["sentiment"]
    # Ray's own message, as KubeRay reports it: the runtime names the node and the import.
    assert 'node "tokenizer"' in app["message"] and "NoSuchTokenizer" in app["message"], app
    # The build failed before Serve touched a deployment: v1 answered all along.
    assert load.results and load.failures == [], load.failures[:5]
    assert load.answers(lambda b: b["label"]) == ["neutral"]


async def test_a_constructor_that_raises_fails_the_deployment_by_name_and_old_replicas_serve(
    stack: Stack, namespace: str
) -> None:
    # Two replicas: Ray Serve's rolling update replaces one at a time and stops when the
    # new ones fail, so the other old replica keeps answering. (With one replica Serve
    # stops it first and the route answers 503 until the next version: BENCHMARKS.md.)
    registry_name = await deploy(stack, namespace, "mini", mini("1", replicas=2))
    await wait_ready(stack, namespace, "mini")
    url = stack.serve_url(namespace, "mini", "/sentiment")

    async with LoadLoop(url, TEXT) as load:
        # Numbers in the word list: Sentiment.__init__ calls .lower() on each and raises.
        published = time.monotonic()
        await stack.publish(registry_name, mini("2", positive=[1, 2], replicas=2).SerializeToString())
        await stack.post_published_event(registry_name)
        sg = await _wait_app_failed(stack, namespace)
        await asyncio.sleep(10)
        failed_during_update = len(load.failures)
        # A good version recovers in place.
        await stack.publish(registry_name, mini("3", positive=["fine"], replicas=2).SerializeToString())
        await stack.post_published_event(registry_name)
        await load.until(lambda: load.answers(lambda b: b.get("label"))[-1:] == ["positive"], 180, "v3's answer")

    figure(f"constructor failure (2 replicas), requests: {load.summary(published)}")
    ready = condition(sg, "Ready")
    assert ready["status"] == "False" and "sentiment: DEPLOY_FAILED" in ready["message"], ready
    app = sg["status"]["applications"]["sentiment"]
    deployment = app["deployments"]["sentiment"]
    assert deployment["status"] in ("DEPLOY_FAILED", "UNHEALTHY"), app
    # Ray's own message: the failed rolling update and the constructor's exception.
    assert "rolling update" in deployment["message"] and "lower" in deployment["message"], deployment
    assert app["deployments"]["tokenizer"]["status"] == "HEALTHY", app
    assert failed_during_update == 0, load.summary(published)
    assert load.failures == [], load.summary(published)
    assert load.answers(lambda b: b["label"]) == ["neutral", "positive"]
    await wait_ready(stack, namespace, "mini")


async def test_deleting_a_servegraph_removes_its_rayservice_cluster_and_pods(stack: Stack, namespace: str) -> None:
    await deploy(stack, namespace, "mini", mini("1"))
    await wait_ready(stack, namespace, "mini")
    assert _names(stack, namespace, "rayclusters") and _names(stack, namespace, "pods")
    kept = store_name("mini")

    async def kept_graph() -> bool:  # written once the version is Ready and stable
        return kept in _names(stack, namespace, "configmaps")

    await eventually(kept_graph, within=180, interval=1, what=f"the kept-graph ConfigMap {kept}")

    stack.cp.kubectl("delete", "servegraph", "mini", "-n", namespace, "--wait=false")

    async def gone() -> bool:
        owned = any(_names(stack, namespace, kind) for kind in ("rayservices", "rayclusters", "pods", "services"))
        # Not "no ConfigMaps": every namespace keeps its kube-root-ca.crt.
        return not owned and kept not in _names(stack, namespace, "configmaps")

    await eventually(
        gone, within=180, interval=1, what="the RayService, its RayCluster, pods, Services and kept graphs gone"
    )
    assert stack.get("namespace", "", namespace) is not None, "the namespace itself stays"


def _names(stack: Stack, namespace: str, kind: str) -> list[str]:
    out = stack.cp.kubectl("get", kind, "-n", namespace, "-o", "json").stdout
    return [i["metadata"]["name"] for i in json.loads(out)["items"]]
