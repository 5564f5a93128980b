"""Clusters sized from the pods that will run: worker counts planned for the ServeGraph's
pod overrides, and replicas that fit no such pod refused by name (issue 22, part 1)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import deployment, graph
from reconcile_support import KEY, Cluster

from servegraph.cli.main import main
from servegraph.graph import GraphError
from servegraph.graph.validate import to_model
from servegraph.graph.workers import PodShape, plan_worker_groups
from servegraph.render import RayServiceOptions, render_rayservice
from servegraph.render.rayservice import PodOverrides, worker_pod_shape
from servegraph.v1 import graph_pb2


def composition(apps: int = 4, nodes: int = 4, cpus: float = 0.1, memory: int = 0) -> graph_pb2.Graph:
    """The issue's graph: `apps` applications of `nodes` chained nodes, each `cpus` per replica."""
    out = []
    for a in range(apps):
        app = graph_pb2.Application(name=f"a{a}", route_prefix=f"/a{a}", ingress="n0")
        for i in range(nodes):
            node = deployment(f"pkg.mod:N{i}", cpus=cpus)
            node.resources.memory_bytes = memory
            if i + 1 < nodes:
                node.deployment.kwargs["next"].node.id = f"n{i + 1}"
            app.nodes[f"n{i}"].CopyFrom(node)
        out.append(app)
    return graph(*out, name="composition")


def workers(limits: dict[str, Any]) -> RayServiceOptions:
    return RayServiceOptions(name="c", workers=PodOverrides(resources={"limits": limits, "requests": dict(limits)}))


def cpu_group(manifest: dict[str, Any]) -> dict[str, Any]:
    (group,) = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    return group


def test_worker_count_follows_the_overridden_pod_not_the_default() -> None:
    """16 replicas at 0.1 CPU in 1-CPU workers need 2 workers; planned for the default 4-CPU
    worker and then shrunk, they got 1 and six replicas never ran."""
    model = to_model(composition())
    default = cpu_group(render_rayservice(model, RayServiceOptions(name="c")))
    assert (default["replicas"], default["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]) == (1, "4")
    small = cpu_group(render_rayservice(model, workers({"cpu": "1", "memory": "2Gi"})))
    assert small["replicas"] == small["minReplicas"] == small["maxReplicas"] == 2
    assert small["template"]["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "1", "memory": "2Gi"}


def test_a_fractional_cpu_limit_is_planned_as_ray_sees_it() -> None:
    """KubeRay starts Ray with `--num-cpus` = the limit rounded up: 500m is one CPU to Ray."""
    assert worker_pod_shape({"limits": {"cpu": "500m"}}) == PodShape(cpus=1.0)
    assert worker_pod_shape({"requests": {"cpu": "2500m", "memory": "2e9"}}) == PodShape(
        cpus=3.0, memory_bytes=2_000_000_000
    )
    assert worker_pod_shape({"limits": {"nvidia.com/gpu": "2", "memory": "1.5Gi"}}) == PodShape(
        gpus=2, memory_bytes=3 * 2**29
    )
    assert worker_pod_shape(None) == PodShape()


def test_memory_of_the_overridden_pod_counts_workers_too() -> None:
    model = to_model(composition(apps=1, nodes=4, cpus=0.1, memory=2**30))
    plans = plan_worker_groups(model, PodShape(memory_bytes=2 * 2**30))
    assert [(p.name, p.max_workers, p.memory_bytes) for p in plans] == [("cpu", 2, 2 * 2**30)]


def test_a_replica_bigger_than_the_overridden_pod_is_refused_naming_node_need_and_pod() -> None:
    model = to_model(composition(apps=1, nodes=2, cpus=2))
    with pytest.raises(GraphError) as raised:
        render_rayservice(model, workers({"cpu": "1"}))
    problems = [str(p) for p in raised.value.problems]
    assert problems == [
        f'application "a0", node "n{i}", field resources: one replica does not fit a worker of group "cpu": '
        "num_cpus 2 > 1 (the worker pod set by the ServeGraph: num_cpus 1)"
        for i in (1, 0)  # topological order: dependencies first
    ]


def test_an_override_that_is_not_a_quantity_is_named() -> None:
    with pytest.raises(GraphError, match=r"spec.rayService.workers.resources: not a Kubernetes quantity: 'lots'"):
        render_rayservice(to_model(composition()), workers({"cpu": "lots"}))


def _write(tmp_path: Path, name: str, data: Any) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if not isinstance(data, bytes | str) else data)  # type: ignore[arg-type]
    return path


def test_validate_and_render_plan_with_the_pods_of_a_servegraph(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph_file = tmp_path / "g.pb"
    graph_file.write_bytes(composition(apps=1, nodes=2, cpus=2).SerializeToString())
    small = _write(
        tmp_path,
        "sg.yaml",
        {
            "apiVersion": "servegraph.io/v1alpha1",
            "kind": "ServeGraph",
            "metadata": {"name": "small"},
            "spec": {
                "source": {"url": "https://registry.example/g", "tokenSecretRef": {"name": "token"}},
                "rayService": {"workers": {"resources": {"limits": {"cpu": "1"}}}},
            },
        },
    )
    assert main(["validate", str(graph_file), "--pods", str(small)]) == 2
    err = capsys.readouterr().err
    assert 'node "n0", field resources: one replica does not fit a worker of group "cpu": num_cpus 2 > 1' in err
    assert main(["render", str(graph_file), "--pods", str(small)]) == 2

    roomy = _write(tmp_path, "rs.yaml", {"workers": {"resources": {"limits": {"cpu": "3"}}}})
    assert main(["validate", str(graph_file), "--pods", str(roomy)]) == 0
    assert f"fits the pods of spec.rayService in {roomy}" in capsys.readouterr().out
    assert main(["render", str(graph_file), "--pods", str(roomy)]) == 0
    manifest = yaml.safe_load(capsys.readouterr().out)
    group = cpu_group(manifest)
    # Two nodes of 2 CPUs each in 3-CPU workers: one replica per worker.
    assert (group["replicas"], group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]) == (2, "3")

    assert main(["validate", str(graph_file), "--pods", str(_write(tmp_path, "bad.yaml", "[1, 2]"))]) == 2
    assert "no ServeGraph (nor a spec.rayService section) in it: it holds a YAML list" in capsys.readouterr().err


async def test_the_operator_refuses_pods_too_small_and_keeps_what_runs() -> None:
    c = Cluster()
    await c.started()
    assert c.condition("Applied") == ("True", "UpToDate")
    running = c.api.rayservices[KEY]["spec"]
    c.body["spec"]["rayService"] = {"workers": {"resources": {"limits": {"cpu": "1"}}}}
    c.body["metadata"]["generation"] = 2
    c.publish(composition(apps=1, nodes=2, cpus=2).SerializeToString())
    await c.reconcile()
    assert c.condition("GraphValid") == ("True", "Valid")  # the graph is fine; the pods are not
    assert c.condition("Applied") == ("False", "PodsTooSmall")
    message = next(x for x in c.body["status"]["conditions"] if x["type"] == "Applied")["message"]
    assert 'node "n0", field resources: one replica does not fit a worker of group "cpu": num_cpus 2 > 1' in message
    assert c.api.rayservices[KEY]["spec"] == running  # nothing written over what serves

    c.body["spec"]["rayService"] = {"workers": {"resources": {"limits": {"cpu": "2"}}}}
    c.body["metadata"]["generation"] = 3
    c.watch_servegraph()
    await c.reconcile()
    assert c.condition("Applied") == ("True", "UpToDate")
    assert cpu_group(c.api.rayservices[KEY])["replicas"] == 2
