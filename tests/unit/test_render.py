"""Renderers: worker groups fit the DAG, names fit KubeRay, output is stable."""

from __future__ import annotations

import pytest
import yaml
from builders import chain_app, deployment, graph, ref
from support import SAMPLES

from servegraph.graph import GraphError, load_graph
from servegraph.graph.validate import to_model
from servegraph.graph.workers import plan_worker_groups
from servegraph.names import SPEC_HASH_ANNOTATION
from servegraph.render import (
    PodOverrides,
    RayServiceOptions,
    rayservice_name,
    render_rayservice,
    serve_config_yaml,
)
from servegraph.v1 import graph_pb2


def _groups(manifest: dict) -> dict[str, dict]:  # type: ignore[type-arg]
    return {g["groupName"]: g for g in manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]}


def test_heterogeneous_graph_gets_cpu_and_gpu_groups() -> None:
    manifest = render_rayservice(load_graph(SAMPLES / "heterogeneous.pb"), RayServiceOptions(name="h"))
    groups = _groups(manifest)
    assert set(groups) == {"cpu", "gpu"}
    gpu = groups["gpu"]
    limits = gpu["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"
    # embedder autoscales 1..4 replicas of 1 GPU each, one GPU per worker
    assert (gpu["minReplicas"], gpu["replicas"], gpu["maxReplicas"]) == (1, 1, 4)
    assert gpu["template"]["spec"]["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert "nvidia.com/gpu" not in groups["cpu"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert manifest["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    assert all(g["rayStartParams"] == {} for g in groups.values())


def test_fixed_replicas_size_cpu_group_without_autoscaling() -> None:
    app = chain_app(length=3)
    for node in app.nodes.values():
        node.resources.num_cpus = 2
        node.scaling.num_replicas = 3  # 3 nodes x 3 replicas x 2 CPUs = 18 CPUs
    manifest = render_rayservice(to_model(graph(app)), RayServiceOptions(name="x"))
    (group,) = _groups(manifest).values()
    assert (group["minReplicas"], group["replicas"], group["maxReplicas"]) == (5, 5, 5)  # 4-CPU workers
    assert "enableInTreeAutoscaling" not in manifest["spec"]["rayClusterConfig"]


def test_replica_too_big_for_hinted_worker_is_a_validation_error_naming_the_node() -> None:
    """Validation plans the worker groups, so what it accepts the renderer can always size."""
    g = graph()
    g.cluster.worker_groups.add(name="small", cpus_per_worker=1)
    g.applications[0].nodes["n1"].resources.num_cpus = 3
    with pytest.raises(
        GraphError,
        match=r'node "n1", field resources: one replica does not fit a worker of group "small": num_cpus 3 > 1',
    ):
        to_model(g)


def test_accelerator_types_get_their_own_group() -> None:
    app = chain_app(length=3)
    app.nodes["n1"].resources.num_gpus = 1
    app.nodes["n1"].resources.accelerator_type = "H100 80GB"
    app.nodes["n2"].resources.num_gpus = 1
    names = [p.name for p in plan_worker_groups(to_model(graph(app)))]
    assert names == ["cpu", "gpu", "gpu-h100-80gb"]


@pytest.mark.parametrize(
    "name",
    ["mini", "a" * 47, "a" * 48, "My.Graph_Name", "9lives", "x" * 253],
)
def test_rayservice_names_fit_kuberay(name: str) -> None:
    out = rayservice_name(name)
    assert len(out) <= 47
    assert out[0].isalpha() and out == out.lower() and "." not in out and "_" not in out
    if len(name) <= 47 and name.isalpha() and name.islower():
        assert out == name


def test_long_names_do_not_collide() -> None:
    assert rayservice_name("a" * 60 + "x") != rayservice_name("a" * 60 + "y")


def test_overrides_and_owner_reference_are_rendered() -> None:
    owner = {
        "apiVersion": "servegraph.io/v1alpha1",
        "kind": "ServeGraph",
        "name": "sg",
        "uid": "u-1",
        "controller": True,
    }
    options = RayServiceOptions(
        name="sg",
        namespace="team",
        labels={"servegraph.io/graph": "sg"},
        image="example.com/ray:custom",
        ray_version="2.60.0",
        head=PodOverrides(service_account_name="ray-head", resources={"limits": {"cpu": "1"}}),
        workers=PodOverrides(
            node_selector={"pool": "ray"},
            tolerations=({"key": "gpu", "operator": "Exists"},),
            env=({"name": "A", "value": "1"},),
        ),
        upgrade_strategy="NewCluster",
        suspend=False,
        owner_references=(owner,),
    )
    m = render_rayservice(load_graph(SAMPLES / "mini.pb"), options)
    assert m["metadata"]["ownerReferences"] == [owner]
    assert m["metadata"]["labels"]["servegraph.io/graph"] == "sg"
    assert m["spec"]["upgradeStrategy"] == {"type": "NewCluster"}
    head = m["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    assert head["serviceAccountName"] == "ray-head"
    # The override names cpu: its limit replaces the plan's cpu request and limit; memory stays planned.
    assert head["containers"][0]["resources"] == {
        "requests": {"memory": "8Gi"},
        "limits": {"memory": "8Gi", "cpu": "1"},
    }
    assert head["containers"][0]["image"] == "example.com/ray:custom"
    worker = m["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]
    assert worker["nodeSelector"] == {"pool": "ray"}
    assert worker["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert worker["containers"][0]["env"] == [{"name": "A", "value": "1"}]


def test_spec_hash_changes_with_spec_only() -> None:
    g = load_graph(SAMPLES / "mini.pb")
    a = render_rayservice(g, RayServiceOptions(name="mini"))
    b = render_rayservice(g, RayServiceOptions(name="mini"))
    c = render_rayservice(g, RayServiceOptions(name="mini", image="other:1"))
    assert a == b
    assert a["metadata"]["annotations"][SPEC_HASH_ANNOTATION] != c["metadata"]["annotations"][SPEC_HASH_ANNOTATION]


def test_serve_config_yaml_is_plain_and_stable() -> None:
    g = load_graph(SAMPLES / "complete.pb")
    text = serve_config_yaml(g)
    assert text == serve_config_yaml(load_graph(SAMPLES / "complete.txtpb"))
    assert "&id" not in text and "*id" not in text
    config = yaml.safe_load(text)
    reviews = config["applications"][0]
    assert reviews["args"]["ingress"] == "pipeline"
    ids = [n["id"] for n in reviews["args"]["nodes"]]
    assert ids.index("tokenizer") < ids.index("sentiment-small") < ids.index("vote") < ids.index("pipeline")
    options = {d["name"]: d for d in reviews["deployments"]}
    small = options["sentiment-small"]
    assert small["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 8,
        "initial_replicas": 2,
        "target_ongoing_requests": 4.0,
        "upscale_delay_s": 5.0,
        "downscale_delay_s": 120.0,
    }
    assert small["user_config"] == {"threshold": 0.6}
    assert small["ray_actor_options"] == {"num_cpus": 1.0, "resources": {"fast-disk": 1.0}}
    assert options["tokenizer"]["max_queued_requests"] == -1
    assert reviews["runtime_env"]["pip"] == ["emoji==2.14.1"]


def test_edges_follow_arguments() -> None:
    app = graph_pb2.Application(name="a", route_prefix="/", ingress="top")
    app.nodes["top"].CopyFrom(deployment("m:Top", ref("x"), ref("y"), other=ref("x")))
    app.nodes["x"].CopyFrom(deployment("m:X"))
    app.nodes["y"].CopyFrom(deployment("m:Y"))
    node = to_model(graph(app)).applications[0].nodes["top"]
    assert node.edges == ("x", "y")


def test_resource_overrides_keep_what_they_do_not_name() -> None:
    """Shrinking a GPU group's cpu and memory keeps its nvidia.com/gpu request and limit."""
    app = graph_pb2.Application(name="a", route_prefix="/a", ingress="m")
    app.nodes["m"].CopyFrom(deployment("servegraph.examples:Embedder"))
    app.nodes["m"].resources.num_gpus = 1
    small = {"requests": {"cpu": "300m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "16Gi"}}
    rs = render_rayservice(to_model(graph(app)), RayServiceOptions(name="g", workers=PodOverrides(resources=small)))
    (group,) = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert group["template"]["spec"]["containers"][0]["resources"] == {
        "requests": {"nvidia.com/gpu": "1", "cpu": "300m", "memory": "1Gi"},
        "limits": {"nvidia.com/gpu": "1", "cpu": "2", "memory": "16Gi"},
    }


def test_custom_resources_reach_ray_start_as_one_shell_word() -> None:
    """KubeRay builds `ray start ... --resources=VALUE` as a bash line: the JSON must be quoted."""
    import shlex

    app = graph_pb2.Application(name="a", route_prefix="/a", ingress="m")
    app.nodes["m"].CopyFrom(deployment("servegraph.examples:Tokenizer"))
    app.nodes["m"].resources.custom["fast disk"] = 2
    rs = render_rayservice(to_model(graph(app)), RayServiceOptions(name="g"))
    (group,) = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    value = group["rayStartParams"]["resources"]
    words = shlex.split(f"ray start --resources={value} --block")
    assert words[2] == '--resources={"fast disk": 2.0}'
