"""Placement per worker group on the real node under the real KubeRay (issue 22, item 4).

The node is tainted (NoSchedule) and labelled for this test alone. `mini` is published with
a worker-group hint that tolerates the taint and selects the label; its ServeGraph tolerates
the taint for the head and gives the group a PriorityClass (`workerGroups`): it becomes
Ready on the node and answers. A second ServeGraph of the same graph re-aims the group's
node selector (`workerGroups.cpu.nodeSelector`, over the hint) at a label no node has: its
worker stays Pending, and the pod says why in the scheduler's words, while the first keeps
answering. The taint, the label and the PriorityClass are removed at teardown, pass or fail.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from node_support import RAY_PODS, deploy, figure, mini, wait_ready

from servegraph.v1 import graph_pb2
from servegraph_testbed.node.routes import answer, ask
from servegraph_testbed.node.stack import Stack
from servegraph_testbed.waiting import eventually

TAINT = "servegraph.io/test-placement"
LABEL = "servegraph.io/test-pool"
PRIORITY = 1000


class Placement:
    """The node's taint and label values and the PriorityClass made for one test."""

    def __init__(self, node: str, value: str, priority_class: str) -> None:
        self.node, self.value, self.priority_class = node, value, priority_class

    @property
    def toleration(self) -> dict[str, Any]:
        return {"key": TAINT, "operator": "Equal", "value": self.value, "effect": "NoSchedule"}


@pytest.fixture
def placement(stack: Stack, namespace: str) -> Iterator[Placement]:
    node, cp = stack.cluster.node_name, stack.cp
    made = Placement(node, namespace, f"{namespace}-serving")
    try:
        priority_class = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": made.priority_class},
            "value": PRIORITY,
            "preemptionPolicy": "Never",  # nothing else on the node is evicted for it
        }
        cp.kubectl("apply", "-f", "-", stdin=json.dumps(priority_class))
        cp.kubectl("label", "node", node, f"{LABEL}={made.value}", "--overwrite")
        cp.kubectl("taint", "node", node, f"{TAINT}={made.value}:NoSchedule", "--overwrite")
        yield made
    finally:
        # Every step even if another failed: a taint left behind would keep every later
        # test's pods off the node.
        cp.kubectl("taint", "node", node, f"{TAINT}:NoSchedule-", check=False)
        cp.kubectl("label", "node", node, f"{LABEL}-", check=False)
        cp.kubectl("delete", "priorityclass", made.priority_class, "--ignore-not-found", check=False)
        left = stack.get("node", "", node) or {}
        taints = [t for t in (left.get("spec") or {}).get("taints") or () if t.get("key") == TAINT]
        assert not taints, f"the test's taint is still on node {node}: {taints}"
        assert LABEL not in (left.get("metadata") or {}).get("labels", {}), f"label {LABEL} still on node {node}"


def placed_mini(placement: Placement) -> graph_pb2.Graph:
    """mini, whose CPU worker group tolerates the node's taint and selects its label (the graph's hint)."""
    graph = mini("1")
    hint = graph.cluster.worker_groups.add(name="cpu")
    hint.node_selector[LABEL] = placement.value
    hint.tolerations.add(key=TAINT, operator="Equal", value=placement.value, effect="NoSchedule")
    return graph


def pods(stack: Stack, namespace: str, cluster_prefix: str, node_type: str) -> list[dict[str, Any]]:
    """The Ray pods of one RayService's clusters (`ray.io/cluster` is `<rayservice>-<suffix>`)."""
    out = stack.cp.kubectl("get", "pods", "-n", namespace, "-l", f"ray.io/node-type={node_type}", "-o", "json")
    items: list[dict[str, Any]] = json.loads(out.stdout)["items"]
    return [p for p in items if p["metadata"]["labels"].get("ray.io/cluster", "").startswith(f"{cluster_prefix}-")]


def unschedulable(pod: dict[str, Any]) -> dict[str, Any] | None:
    scheduled = [c for c in pod["status"].get("conditions") or () if c["type"] == "PodScheduled"]
    if pod["status"].get("phase") == "Pending" and scheduled and scheduled[0]["status"] == "False":
        return dict(scheduled[0])
    return None


async def test_worker_groups_are_placed_on_a_tainted_labelled_node_and_a_misplaced_one_stays_pending(
    stack: Stack, namespace: str, placement: Placement
) -> None:
    head = {**RAY_PODS["head"], "tolerations": [placement.toleration]}
    groups = {"cpu": {"priorityClassName": placement.priority_class}}
    applied = time.monotonic()
    registry_name = await deploy(stack, namespace, "mini", placed_mini(placement), head=head, workerGroups=groups)
    await wait_ready(stack, namespace, "mini", within=480)
    ready_s = time.monotonic() - applied

    # The pods are where the hint and the overrides put them, on the tainted node.
    (worker,) = pods(stack, namespace, "mini", "worker")
    assert worker["spec"]["nodeName"] == placement.node
    assert worker["spec"]["nodeSelector"] == {LABEL: placement.value}
    assert placement.toleration in worker["spec"]["tolerations"]
    assert worker["spec"]["priorityClassName"] == placement.priority_class
    assert worker["spec"]["priority"] == PRIORITY, "the PriorityClass was resolved by admission"
    (head_pod,) = pods(stack, namespace, "mini", "head")
    assert head_pod["spec"]["nodeName"] == placement.node
    assert placement.toleration in head_pod["spec"]["tolerations"]
    assert "priorityClassName" not in head_pod["spec"], "workerGroups places worker pods only"
    url = stack.serve_url(namespace, "mini", "/sentiment")
    status, body = await answer(url, {"text": "a great and good day"})
    assert (status, body) == (200, {"label": "positive", "score": 1.0})

    # The same graph, its group re-aimed by the ServeGraph at a label no node has.
    nowhere = {"cpu": {"nodeSelector": {LABEL: "no-such-pool"}}}
    manifest = stack.servegraph_manifest(
        namespace,
        "stuck",
        registry_name,
        {**RAY_PODS, "head": head, "workerGroups": nowhere},
        {"progressDeadline": "20m"},
    )
    await asyncio.to_thread(stack.apply, manifest)

    async def pending() -> dict[str, Any] | None:
        found = pods(stack, namespace, "stuck", "worker")
        return unschedulable(found[0]) if len(found) == 1 else None

    why = await eventually(pending, within=240, interval=2, what="the stuck group's worker Pending, unschedulable")
    assert why is not None
    assert why["reason"] == "Unschedulable", why
    assert "didn't match Pod's node affinity/selector" in why["message"], why
    (stuck,) = pods(stack, namespace, "stuck", "worker")
    assert stuck["spec"]["nodeSelector"] == {LABEL: "no-such-pool"}, "the override replaced the hint's value"
    assert placement.toleration in stuck["spec"]["tolerations"], "the hint's toleration stays"

    # It stays so, while the placed graph answers throughout.
    for _ in range(10):
        status, body = await ask(url, {"text": "an awful, boring day"})
        assert (status, body["label"]) == (200, "negative"), body
        await asyncio.sleep(1.5)
    (stuck,) = pods(stack, namespace, "stuck", "worker")
    assert unschedulable(stuck) is not None and "nodeName" not in stuck["spec"], stuck["status"]

    async def not_ready() -> dict[str, Any] | None:
        sg = await asyncio.to_thread(stack.get, "servegraph", namespace, "stuck")
        ready = [c for c in ((sg or {}).get("status") or {}).get("conditions") or () if c["type"] == "Ready"]
        return ready[0] if ready and ready[0]["status"] == "False" else None

    await eventually(not_ready, within=30, interval=1, what="the stuck ServeGraph Ready=False")

    figure(
        f"placement: mini on a tainted, labelled node: apply -> Ready {ready_s:.1f} s; "
        f"a group selecting no node: Pending, {why['reason']}: {why['message']}"
    )
