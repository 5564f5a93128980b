"""A publish restarts only what changed, counted by Ray Serve's own replica ids on a real Ray.

The e2e graph (5 applications, 17 nodes, every router kind) is published again three
ways: only its version changed, one node's `user_config` changed, one node's resources
changed. Each replica Ray Serve runs has an id; a restarted replica gets a new one.
"""

from __future__ import annotations

import asyncio
import io
import urllib.request
from collections.abc import Callable
from pathlib import Path

import aiohttp
from e2e_support import E2E_GRAPH, request
from google.protobuf import text_format
from prometheus_client.parser import text_string_to_metric_families
from rayhead import RayHead

from servegraph.raydash import up
from servegraph.raydash.dashboard import RayDashboard
from servegraph.v1 import graph_pb2
from servegraph_testbed.waiting import eventually

Replicas = dict[tuple[str, str], tuple[str, ...]]


async def _publish(head: RayHead, msg: graph_pb2.Graph, path: Path) -> Replicas:
    """`servegraph up` the graph (waits until every application is RUNNING); its replica ids."""
    await asyncio.to_thread(path.write_bytes, msg.SerializeToString())
    out, err = io.StringIO(), io.StringIO()
    code = await up.up(path, address=head.address, token=head.token, timeout_s=300, out=out, err=err)
    assert code == 0, err.getvalue()

    deployments = sum(len(app.nodes) for app in msg.applications)  # every node is one deployment

    async def settled() -> Replicas | None:
        # RUNNING can be reported while an old replica still stops: wait for the target count.
        async with RayDashboard(head.address, head.token) as dash:
            state = await dash.get_applications()
        ids = {(a.name, d.name): d.replica_ids for a in state.applications.values() for d in a.deployments}
        stopping = [k for k, v in ids.items() if len(v) != 1]
        return None if stopping or len(ids) != deployments else ids

    found = await eventually(settled, within=120, interval=1, what="one replica per deployment")
    assert found is not None
    return found


def _changed(before: Replicas, after: Replicas) -> set[tuple[str, str]]:
    return {k for k in before if before[k] != after.get(k)}


def _version_seen(port: int, version: str) -> bool:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name == "ray_servegraph_requests_total"
                and labels.get("graph") == "e2e"
                and labels.get("graph_version") == version
                and labels.get("node") == "pipeline"
            ):
                return True
    return False


async def test_a_publish_restarts_only_what_changed(
    ray_head: RayHead,
    serve_port: int,
    http: aiohttp.ClientSession,
    serve_url: Callable[[str], str],
    tmp_path: Path,
) -> None:
    base = text_format.Parse(E2E_GRAPH.read_text(), graph_pb2.Graph())
    base.version = "restart-1"
    path = tmp_path / "g.pb"
    first = await _publish(ray_head, base, path)

    # 1. Only the version: no replica restarts, and the routers' metrics carry the new version.
    v2 = graph_pb2.Graph()
    v2.CopyFrom(base)
    v2.version = "restart-2"
    second = await _publish(ray_head, v2, path)
    assert _changed(first, second) == set(), "a version-only publish restarted replicas"
    status, _ = await request(http, serve_url("/chain"), {"x": 1})
    assert status == 200

    async def relabelled() -> bool:
        return _version_seen(ray_head.metrics_port, "restart-2")

    await eventually(
        relabelled,
        within=90,
        interval=2,
        what="the router's metrics labelled with the new version, without a restart",
    )

    # 2. One node's user_config: reconfigured in place, the answer follows, nothing restarts.
    v3 = graph_pb2.Graph()
    v3.CopyFrom(v2)
    v3.version = "restart-3"
    conf = next(a for a in v3.applications if a.name == "config").nodes["conf"]
    conf.user_config["threshold"] = 7
    before_answer = await request(http, serve_url("/config"), {})
    third = await _publish(ray_head, v3, path)
    assert _changed(second, third) == set(), "a user_config change restarted replicas"
    after_answer = await request(http, serve_url("/config"), {})
    assert before_answer[1]["threshold"] == 1 and after_answer[1]["threshold"] == 7
    assert after_answer[1]["replica_id"] == before_answer[1]["replica_id"]

    # 3. One node's resources: that node's replica alone is replaced.
    v4 = graph_pb2.Graph()
    v4.CopyFrom(v3)
    v4.version = "restart-4"
    chain = next(a for a in v4.applications if a.name == "chain")
    chain.nodes["b"].resources.num_cpus = 0.06
    fourth = await _publish(ray_head, v4, path)
    assert _changed(third, fourth) == {("chain", "b")}
    status, body = await request(http, serve_url("/chain"), {"x": 1})
    assert status == 200, body
