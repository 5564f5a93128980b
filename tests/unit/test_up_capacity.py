"""`servegraph up` onto a cluster too small for the graph (issue 47, item 6): said at once, with
the numbers, and nothing deployed; `--start-local` sizes its head for the graph. Before, `up`
waited its whole timeout (300 s) and listed every replica "taken more than 30s to be scheduled".
The dashboard here is a stand-in answering Ray 2.60's shapes; tests/e2e/test_e2e_up.py runs the
same against a real Ray head."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from builders import deployment, graph

from servegraph.graph.validate import to_model
from servegraph.raydash import capacity, up
from servegraph.v1 import graph_pb2

MiB = 1024**2


def wide(nodes: int = 25, cpus: float = 0.1) -> graph_pb2.Graph:
    """The issue's graph: one application of `nodes` nodes at `cpus` each, one replica each."""
    app = graph_pb2.Application(name="wide", route_prefix="/wide", ingress="n0")
    for i in range(nodes):
        app.nodes[f"n{i}"].CopyFrom(deployment(f"pkg.mod:N{i}", cpus=cpus))
    for i in range(1, nodes):
        app.nodes["n0"].deployment.kwargs[f"k{i}"].node.id = f"n{i}"
    return graph(app, name="wide")


def node(
    cpus: float, gpus: float = 0, memory: float = 4096 * MiB, state: str = "ALIVE", **extra: float
) -> dict[str, Any]:
    resources = {"CPU": cpus, "memory": memory, "object_store_memory": 1e9, "node:127.0.0.1": 1.0, **extra}
    if gpus:
        resources["GPU"] = gpus
    return {"node_id": "x", "state": state, "is_head_node": True, "resources_total": resources}


def test_the_issues_graph_needs_more_cpu_than_a_2_cpu_ray() -> None:
    want = capacity.needs(to_model(wide()))
    assert (want.replicas, round(want.cpus, 6)) == (25, 2.5)
    assert capacity.shortfall(want, capacity.alive_resources([node(2)])) == [
        "the graph needs 2.5 CPU for its 25 replicas at their start, the cluster has 2"
    ]
    assert capacity.shortfall(want, capacity.alive_resources([node(2), node(1)])) == []
    assert capacity.shortfall(want, capacity.alive_resources([node(2), node(8, state="DEAD")])) != []


def test_gpus_memory_custom_resources_and_the_largest_replica() -> None:
    g = wide(nodes=2, cpus=1)
    n0 = g.applications[0].nodes["n0"]
    n0.resources.num_gpus = 1
    n0.resources.memory_bytes = 8 * 1024 * MiB
    g.applications[0].nodes["n1"].resources.custom["fast-disk"] = 2
    want = capacity.needs(to_model(g))
    assert capacity.shortfall(want, capacity.alive_resources([node(4)])) == [
        "the graph needs 1 GPU for its 2 replicas at their start, the cluster has 0",
        "the graph needs 8Gi of memory for its 2 replicas at their start, the cluster has 4Gi",
        "the graph needs 2 of the custom resource 'fast-disk', the cluster has 0",
    ]
    # Enough in total, but on no single node: the GPU replica's 8Gi is on one, its GPU on another.
    split = [node(2, gpus=1, memory=2048 * MiB, **{"fast-disk": 2.0}), node(2, memory=16384 * MiB)]
    assert capacity.shortfall(want, capacity.alive_resources(split)) == [
        "one replica of wide/n0 needs 1 CPU, 1 GPU and 8Gi of memory on one Ray node, and no node has that much"
    ]


def test_a_local_head_is_sized_for_the_graph() -> None:
    want = capacity.needs(to_model(wide()))
    assert capacity.local_head_flags(want, machine_cpus=2) == ["--num-cpus=3"]
    assert capacity.local_head_flags(want, machine_cpus=4) == []
    g = wide(nodes=1, cpus=1)
    g.applications[0].nodes["n0"].resources.custom["fast-disk"] = 0.5
    assert capacity.local_head_flags(capacity.needs(to_model(g)), 4) == ['--resources={"fast-disk": 1}']


@pytest.fixture
async def dashboard() -> AsyncIterator[tuple[str, list[str]]]:
    """A dashboard whose one node has 2 CPUs; records every request."""
    seen: list[str] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.path}")
        if request.path == "/api/ray/version":
            return web.json_response({"ray_version": "2.60.0"})
        if request.path == "/api/v0/nodes":
            rows = {"total": 1, "num_after_truncation": 1, "result": [node(2)]}
            return web.json_response({"result": True, "msg": "", "data": {"result": rows}})
        return web.json_response({}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


async def test_up_refuses_at_once_and_deploys_nothing(tmp_path: Path, dashboard: tuple[str, list[str]]) -> None:
    address, seen = dashboard
    path = tmp_path / "wide.pb"
    path.write_bytes(wide().SerializeToString())
    err = io.StringIO()
    assert await up.up(path, address=address, token="t", timeout_s=300, err=err) == 2
    assert err.getvalue().splitlines() == [
        "servegraph up: the graph needs 2.5 CPU for its 25 replicas at their start, the cluster has 2; nothing deployed",
        "servegraph up: deploy to a larger cluster (--address), or start Ray with room for it "
        "(`ray start --head --num-cpus N --num-gpus N --memory BYTES`)",
    ]
    assert not [r for r in seen if r.startswith("PUT")]
