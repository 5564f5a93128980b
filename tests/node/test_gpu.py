"""The heterogeneous sample: its GPU worker group lands on a node that advertises GPUs."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from node_support import RAY_PODS, figure, wait_ready
from support import SAMPLES

from servegraph_testbed.node.routes import answer
from servegraph_testbed.node.stack import Stack

# The sample's GPU group selects nodes by this label (cloud.google.com/gke-accelerator).
ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator=nvidia-l4"


@pytest.fixture
def accelerator_node(stack: Stack) -> Iterator[str]:
    node = stack.cluster.node_name
    stack.cp.kubectl("label", "node", node, ACCELERATOR_LABEL, "--overwrite")
    yield node
    stack.cp.kubectl("label", "node", node, ACCELERATOR_LABEL.split("=")[0] + "-")


async def test_heterogeneous_sample_gpu_group_is_scheduled_with_its_gpu_request(
    stack: Stack, namespace: str, accelerator_node: str
) -> None:
    node = stack.get("node", "", accelerator_node)
    assert node is not None and node["status"]["allocatable"].get("nvidia.com/gpu") == "2"
    await stack.publish(f"{namespace}-het", (SAMPLES / "heterogeneous.pb").read_bytes())
    # Test overrides (documented in docs/testenv.md): the CPU Ray image (there is no CUDA
    # here), and pods sized for a 2-CPU node. The plan's nvidia.com/gpu stays in the pods.
    workers = {"resources": {"requests": {"cpu": "300m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "16Gi"}}}
    overrides = {"image": stack.cluster.images.ref("ray"), "head": RAY_PODS["head"], "workers": workers}
    stack.apply(stack.servegraph_manifest(namespace, "heterogeneous", f"{namespace}-het", overrides))
    await wait_ready(stack, namespace, "heterogeneous", within=420)
    ready_at = time.monotonic()

    pods = json.loads(stack.cp.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
    gpu_pods = [p for p in pods if p["metadata"]["labels"].get("ray.io/group") == "gpu"]
    assert gpu_pods, [p["metadata"]["name"] for p in pods]
    for pod in gpu_pods:
        assert pod["spec"]["nodeName"] == accelerator_node
        assert pod["status"]["phase"] == "Running"
        container = pod["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert container["resources"]["requests"]["nvidia.com/gpu"] == "1"
        assert pod["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    cpu_pods = [p for p in pods if p["metadata"]["labels"].get("ray.io/group") == "cpu"]
    assert cpu_pods and all("nvidia.com/gpu" not in p["spec"]["containers"][0]["resources"]["limits"] for p in cpu_pods)

    # The first request right after Ready is the one that has been lost on its way (once
    # in CI, once in a diagnostic run): sent again, and every loss reported.
    lost: list[str] = []
    status, body = await answer(
        stack.serve_url(namespace, "heterogeneous", "/embed"), {"text": "a fine day"}, lost=lost
    )
    figure(f"GPU sample: Ready -> first answer {time.monotonic() - ready_at:.1f} s; requests lost on the way: {lost}")
    assert status == 200 and len(body["embedding"]) == 16, body
