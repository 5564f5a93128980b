"""Capacity that follows the graph, on a real node under the real KubeRay (issue 22):

- a composition graph like the one a new user tried (4 applications, 16 nodes at 0.1 CPU) in the
  small worker pods the tests use (1 CPU limit) becomes Ready: its worker count is planned
  for those pods, not for the default 4-CPU worker they used to shrink;
- a publish restarts only what changed, counted by Ray Serve's replica ids read through
  the API server's service proxy: a new version and a `user_config` change restart
  none, a change to one node's resources restarts that node's replica alone.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

from node_support import condition, deploy, figure, servegraph, wait_ready, wait_rolled_out

from servegraph.v1 import graph_pb2
from servegraph_testbed.node.routes import answer, ask
from servegraph_testbed.node.stack import Stack
from servegraph_testbed.waiting import eventually

Replicas = dict[tuple[str, str], tuple[str, ...]]
APPS, NODES = 4, 4


def composition(version: str, threshold: float = 0.2, cpus_of_tokenizer: float = 0.1) -> graph_pb2.Graph:
    """Per application, 4 nodes at 0.1 CPU: an ensemble router (`n0`, the ingress) of a sentiment
    model (`n1`, bound to the tokenizer) and the tokenizer (`n2`), combined by a vote (`n3`)."""
    graph = graph_pb2.Graph(name="composition", version=version, schema_version=1)
    for a in range(APPS):
        app = graph.applications.add(name=f"a{a}", route_prefix=f"/a{a}", ingress="n0")
        ensemble = app.nodes["n0"].ensemble
        ensemble.members.add().id = "n1"
        ensemble.members.add().id = "n2"
        ensemble.combiner.id = "n3"
        model = app.nodes["n1"]
        model.deployment.import_path = "servegraph.examples:Sentiment"
        model.deployment.kwargs["tokenizer"].node.id = "n2"
        model.user_config["threshold"] = threshold
        app.nodes["n2"].deployment.import_path = "servegraph.examples:Tokenizer"
        app.nodes["n3"].deployment.import_path = "servegraph.examples:MajorityVote"
        for node_id, node in app.nodes.items():
            node.resources.num_cpus = cpus_of_tokenizer if (a, node_id) == (0, "n2") else 0.1
    return graph


MIXED = {"text": "good and great, but boring"}  # polarity 1/3: positive at threshold 0.2, neutral at 0.5


def replicas(stack: Stack, namespace: str, rayservice: str) -> Replicas:
    """Ray Serve's replica ids per (application, deployment), from the head's dashboard."""
    path = f"/api/v1/namespaces/{namespace}/services/{rayservice}-head-svc:dashboard/proxy/api/serve/applications/"
    doc = json.loads(stack.cp.kubectl("get", "--raw", path).stdout)
    return {
        (app_name, dep_name): tuple(sorted(r["replica_id"] for r in dep.get("replicas") or ()))
        for app_name, app in (doc.get("applications") or {}).items()
        for dep_name, dep in (app.get("deployments") or {}).items()
    }


async def settled(stack: Stack, namespace: str, rayservice: str, within: float = 240) -> Replicas:
    """Replica ids once every deployment runs exactly one replica (none still stopping)."""
    deadline = time.monotonic() + within
    last: Replicas = {}
    while time.monotonic() < deadline:
        try:
            last = await asyncio.to_thread(replicas, stack, namespace, rayservice)
        except Exception:  # the dashboard restarting, a proxy hiccup: not yet
            last = {}
        if len(last) == APPS * NODES and all(len(ids) == 1 for ids in last.values()):
            return last
        await asyncio.sleep(2)
    raise AssertionError(f"not one replica per deployment within {within} s: {last}")


async def publish_and_wait(stack: Stack, registry_name: str, namespace: str, graph: graph_pb2.Graph) -> None:
    await stack.publish(registry_name, graph.SerializeToString())
    await stack.post_published_event(registry_name)
    await wait_rolled_out(stack, namespace, "composition", graph.version, within=300)


async def test_a_composition_in_small_pods_serves_and_a_publish_restarts_only_what_changed(
    stack: Stack, namespace: str
) -> None:
    registry_name = await deploy(stack, namespace, "composition", composition("1"))
    sg = await wait_ready(stack, namespace, "composition", within=480)
    rs = stack.get("rayservice", namespace, "composition")
    assert rs is not None
    (group,) = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    # 16 replicas x 0.1 CPU in 1-CPU workers: two workers, both running.
    assert group["replicas"] == 2, group
    assert all(a["status"] == "RUNNING" for a in sg["status"]["applications"].values()), sg["status"]
    url = stack.serve_url(namespace, "composition", "/a3")
    status, body = await answer(url, MIXED)
    assert (status, body["label"]) == (200, "positive"), body
    first = await settled(stack, namespace, "composition")

    # 1. Only the version changes: no replica restarts.
    await publish_and_wait(stack, registry_name, namespace, composition("2"))
    second = await settled(stack, namespace, "composition")
    assert second == first, "a version-only publish restarted replicas"

    # 2. One node's user_config (every application's model, threshold 0.2 -> 0.5): reconfigured
    # in place, none restarted; publish -> new answer measured.
    started = time.monotonic()
    await stack.publish(registry_name, composition("3", threshold=0.5).SerializeToString())
    await stack.post_published_event(registry_name)
    took = await _until_label(url, MIXED, "neutral", started)
    await wait_rolled_out(stack, namespace, "composition", "3", within=300)
    third = await settled(stack, namespace, "composition")
    assert third == second, "a user_config change restarted replicas"

    # 3. One node's resources: that node's replica alone is replaced.
    await publish_and_wait(stack, registry_name, namespace, composition("4", threshold=0.5, cpus_of_tokenizer=0.11))
    fourth = await settled(stack, namespace, "composition")
    restarted = {k for k in third if third[k] != fourth[k]}
    assert restarted == {("a0", "n2")}, restarted
    status, body = await ask(stack.serve_url(namespace, "composition", "/a0"), MIXED)
    assert (status, body["label"]) == (200, "neutral"), body

    figure(
        f"composition 4 apps x 4 nodes in 1-CPU workers: {group['replicas']} workers; "
        f"user_config change publish -> new answer {took:.1f} s; replicas restarted: version-only 0, "
        f"user_config 0, one node's resources {len(restarted)}"
    )


async def _until_label(url: str, payload: Any, label: str, since: float, within: float = 180) -> float:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        status, body = await ask(url, payload)
        if status == 200 and body.get("label") == label:
            return time.monotonic() - since
        await asyncio.sleep(0.2)
    raise AssertionError(f"no {label!r} answer from {url} within {within} s")


async def test_a_rollout_stuck_on_unschedulable_replicas_says_why(stack: Stack, namespace: str) -> None:
    """The graph caps its worker group at one 1-CPU worker (a hint), too few for 16 replicas
    of 0.1 CPU: Ray Serve cannot place six of them. The ServeGraph and `servegraph status`
    say so with Ray's own words, taken from KubeRay's pendingServiceStatus — never only
    "KubeRay reports no application status yet"."""
    graph = composition("1")
    graph.cluster.worker_groups.add(max_workers=1)
    await deploy(stack, namespace, "stuck", graph)

    async def says_why() -> dict[str, Any] | None:
        sg = await servegraph(stack, namespace, "stuck")
        ready = condition(sg, "Ready") if sg.get("status") else {}
        return sg if ready.get("status") == "False" and "schedul" in ready.get("message", "") else None

    sg = await eventually(says_why, within=480, interval=2, what="Ready=False naming the unscheduled replicas")
    ready = condition(sg, "Ready")
    assert "deployment" in ready["message"], ready
    pending = sg["status"].get("pending") or {}
    assert pending.get("applications"), sg["status"]

    command = [sys.executable, "-m", "servegraph.cli", "status", "stuck", "-n", namespace]
    command += ["--kubeconfig", str(stack.cp.kubeconfig())]
    out = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "schedul" in out.stdout, out.stdout
    figure(f"stuck rollout: Ready says {ready['reason']}: {ready['message'][:160]}")
