"""Renderers: worker groups fit the DAG, names fit KubeRay, output is stable."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
import yaml
from builders import chain_app, deployment, graph, ref
from support import SAMPLES

from servegraph.graph import GraphError, load_graph
from servegraph.graph.validate import to_model
from servegraph.graph.workers import plan_worker_groups
from servegraph.names import SPEC_HASH_ANNOTATION
from servegraph.operator.spec import parse_spec
from servegraph.render import (
    PodOverrides,
    RayServiceOptions,
    rayservice_name,
    render_rayservice,
    serve_config_yaml,
)
from servegraph.render.rayservice import DEFAULT_IMAGE, INCREMENTAL, AutoscalerOptions, UpgradeStrategy
from servegraph.render.upgrade import cluster_differences
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
        restarted_at="2026-01-02T03:04:05Z",
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
    assert worker["containers"][0]["env"] == [{"name": "RAY_SERVE_GRPC_MAX_MESSAGE_SIZE", "value": "4194304"},
                                              {"name": "A", "value": "1"}]  # fmt: skip
    cluster = m["spec"]["rayClusterConfig"]
    for group in [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]:
        annotations = dict(group["template"]["metadata"]["annotations"])
        annotations.pop("servegraph.io/grpcServicers", None)  # the head's: which gRPC services Serve starts with
        assert annotations == {"servegraph.io/restartedAt": "2026-01-02T03:04:05Z"}


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
    assert words[2] == '--resources={"fast disk": 2}'


def test_custom_resources_are_read_by_rays_autoscaler() -> None:
    """Ray's autoscaler reads the same parameter (a quoted JSON of integers) and crashes on
    anything else: a fractional need is rounded up to a whole amount, written as one."""
    from ray.autoscaler._private.kuberay.autoscaling_config import _get_custom_resources  # Ray's own parser

    app = graph_pb2.Application(name="a", route_prefix="/a", ingress="m")
    app.nodes["m"].CopyFrom(deployment("servegraph.examples:Tokenizer"))
    app.nodes["m"].resources.custom["fast-disk"] = 0.5
    rs = render_rayservice(to_model(graph(app)), RayServiceOptions(name="g"))
    (group,) = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert _get_custom_resources({}, group["rayStartParams"], group["groupName"]) == {"fast-disk": 1}


# -- placement per worker group (issue 22, item 4) -------------------------------------------


def _placed_graph() -> graph_pb2.Graph:
    """A CPU node and a GPU node; the graph places the GPU group: a toleration, node affinity
    (required and preferred), a node selector and a priority class."""
    app = chain_app(length=2)
    app.nodes["n1"].resources.num_gpus = 1
    g = graph(app)
    hint = g.cluster.worker_groups.add(name="gpu", gpu=True)
    hint.node_selector["pool"] = "gpu"
    hint.tolerations.add(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
    hint.tolerations.add(key="spot", value="true", effect="NoExecute", toleration_seconds=30)
    required = hint.node_affinity.required.add()
    required.match_expressions.add(key="topology.kubernetes.io/zone", operator="In", values=["a", "b"])
    preferred = hint.node_affinity.preferred.add(weight=10)
    preferred.term.match_expressions.add(key="gpu-memory-gib", operator="Gt", values=["40"])
    hint.priority_class_name = "serving-high"
    return g


def _pod(manifest: dict, group: str) -> dict:  # type: ignore[type-arg]
    spec: dict = _groups(manifest)[group]["template"]["spec"]  # type: ignore[type-arg]
    return spec


def test_a_worker_group_hint_places_its_pods() -> None:
    rs = render_rayservice(to_model(_placed_graph()), RayServiceOptions(name="g"))
    gpu = _pod(rs, "gpu")
    assert gpu["nodeSelector"] == {"pool": "gpu"}
    assert gpu["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute", "tolerationSeconds": 30},
    ]
    assert gpu["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a", "b"]}
                        ]
                    }
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 10,
                    "preference": {"matchExpressions": [{"key": "gpu-memory-gib", "operator": "Gt", "values": ["40"]}]},
                }
            ],
        }
    }
    assert gpu["priorityClassName"] == "serving-high"
    # The other group and the head are placed by nothing: no field appears.
    for pod in (_pod(rs, "cpu"), rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]):
        assert set(pod) == {"containers"}, pod


def test_servegraph_overrides_layer_over_the_hint_per_field() -> None:
    """workers applies to every group, workerGroups[name] to that group, each over the one before:
    nodeSelector per key, tolerations added (no duplicates), affinity per kind, priority replaced."""
    workers = PodOverrides(
        node_selector={"pool": "shared", "arch": "amd64"},
        tolerations=({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},),
        priority_class_name="serving",
        groups={
            "gpu": PodOverrides(
                node_selector={"pool": "a100"},
                tolerations=({"key": "team", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},),
                affinity={
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}},
                    "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
                },
                priority_class_name="serving-gpu",
            ),
            "not-in-this-graph": PodOverrides(priority_class_name="unused"),
        },
    )
    head = PodOverrides(affinity={"podAffinity": {}}, priority_class_name="ray-head")
    rs = render_rayservice(to_model(_placed_graph()), RayServiceOptions(name="g", head=head, workers=workers))
    gpu, cpu = _pod(rs, "gpu"), _pod(rs, "cpu")
    assert gpu["nodeSelector"] == {"arch": "amd64", "pool": "a100"}
    assert [t["key"] for t in gpu["tolerations"]] == ["nvidia.com/gpu", "spot", "team"]
    assert gpu["affinity"] == workers.groups["gpu"].affinity  # its nodeAffinity replaced the hint's
    assert gpu["priorityClassName"] == "serving-gpu"
    assert cpu["nodeSelector"] == {"arch": "amd64", "pool": "shared"}
    assert cpu["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert cpu["priorityClassName"] == "serving" and "affinity" not in cpu
    head_pod = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    assert head_pod["affinity"] == {"podAffinity": {}} and head_pod["priorityClassName"] == "ray-head"
    assert "nodeSelector" not in head_pod and "tolerations" not in head_pod


def test_a_group_override_changes_the_spec_hash_only_of_what_it_places() -> None:
    g = to_model(_placed_graph())
    plain = render_rayservice(g, RayServiceOptions(name="g"))
    unused = render_rayservice(
        g, RayServiceOptions(name="g", workers=PodOverrides(groups={"other": PodOverrides(priority_class_name="x")}))
    )
    used = render_rayservice(
        g, RayServiceOptions(name="g", workers=PodOverrides(groups={"cpu": PodOverrides(priority_class_name="x")}))
    )
    assert unused == plain
    assert used["metadata"]["annotations"] != plain["metadata"]["annotations"]
    assert _pod(used, "cpu")["priorityClassName"] == "x" and _pod(used, "gpu") == _pod(plain, "gpu")


# -- issue 22: the in-tree autoscaler's sidecar ----------------------------------------------


def _autoscaling_graph(image: str | None = None) -> graph_pb2.Graph:
    g = graph()
    scaling = g.applications[0].nodes["n0"].scaling.autoscaling
    scaling.min_replicas, scaling.max_replicas = 1, 4
    if image:
        g.cluster.image = image
    return g


def _head_image(manifest: dict) -> str:  # type: ignore[type-arg]
    image: str = manifest["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    return image


@pytest.mark.parametrize(
    ("graph_image", "override"),
    [(None, None), ("ghcr.io/servegraph/custom-ray:7", None), (None, "ghcr.io/servegraph/pinned-ray:2")],
    ids=["default", "graph", "servegraph"],
)
def test_the_autoscaler_runs_from_the_heads_image_in_a_small_container(
    graph_image: str | None, override: str | None
) -> None:
    """Not KubeRay's choice: its own default (500m CPU, 512Mi requested) crowds a small node."""
    manifest = render_rayservice(to_model(_autoscaling_graph(graph_image)), RayServiceOptions(name="a", image=override))
    cluster = manifest["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["autoscalerOptions"] == {
        "image": _head_image(manifest),
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "500m", "memory": "512Mi"}},
    }
    assert _head_image(manifest) == (override or graph_image or DEFAULT_IMAGE)


def test_a_servegraphs_autoscaler_settings_are_rendered_over_the_defaults() -> None:
    spec = parse_spec(
        {
            "source": {"url": "https://r/x", "tokenSecretRef": {"name": "t"}},
            "rayService": {
                "autoscaler": {
                    "idleTimeoutSeconds": 30,
                    "upscalingMode": "Conservative",
                    "resources": {"limits": {"cpu": "1"}},
                }
            },
        },
        "ns",
    )
    options = spec.rayservice_options("sg", "ns", {"uid": "u"})
    manifest = render_rayservice(to_model(_autoscaling_graph()), options)
    assert manifest["spec"]["rayClusterConfig"]["autoscalerOptions"] == {
        "image": DEFAULT_IMAGE,
        "idleTimeoutSeconds": 30,
        "upscalingMode": "Conservative",
        # The cpu named by the override is wholly its own (no request: Kubernetes defaults it
        # to the limit); memory keeps the defaults.
        "resources": {"requests": {"memory": "256Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}},
    }
    without = render_rayservice(to_model(_autoscaling_graph()), RayServiceOptions(name="sg"))
    assert manifest["metadata"]["annotations"] != without["metadata"]["annotations"], "a change is written"
    differences = list(cluster_differences(without["spec"]["rayClusterConfig"], manifest["spec"]["rayClusterConfig"]))
    assert differences == ["autoscalerOptions changed"]


def test_no_autoscaler_is_rendered_without_autoscaling_and_an_incremental_upgrade_gets_one() -> None:
    options = RayServiceOptions(name="x", autoscaler=AutoscalerOptions(idle_timeout_seconds=30))
    fixed = render_rayservice(to_model(graph()), options)
    assert "autoscalerOptions" not in fixed["spec"]["rayClusterConfig"]
    incremental = UpgradeStrategy(INCREMENTAL, gateway_class_name="g", step_size_percent=10, interval_seconds=5)
    manifest = render_rayservice(to_model(graph()), replace(options, upgrade_strategy=incremental))
    assert manifest["spec"]["rayClusterConfig"]["autoscalerOptions"]["idleTimeoutSeconds"] == 30


def test_an_incremental_upgrade_starts_every_worker_group_from_zero() -> None:
    """KubeRay starts the new cluster of an incremental upgrade at minReplicas and lets Serve's
    target_capacity grow it: at the full count both clusters would hold every worker throughout."""
    fixed = render_rayservice(to_model(graph()), RayServiceOptions(name="x"))
    incremental = UpgradeStrategy(INCREMENTAL, gateway_class_name="g", step_size_percent=10, interval_seconds=5)
    manifest = render_rayservice(to_model(graph()), RayServiceOptions(name="x", upgrade_strategy=incremental))
    before = fixed["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    after = manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert [g["minReplicas"] for g in before] == [g["replicas"] for g in before] != [0] * len(before)
    assert [g["minReplicas"] for g in after] == [0] * len(after)
    assert [(g["replicas"], g["maxReplicas"]) for g in after] == [(g["replicas"], g["maxReplicas"]) for g in before]
    full = copy.deepcopy(manifest["spec"]["rayClusterConfig"])
    for group in full["workerGroupSpecs"]:
        group["minReplicas"] = group["replicas"]
    assert list(cluster_differences(full, manifest["spec"]["rayClusterConfig"])) == [], (
        "no new cluster for it: KubeRay's cluster hash leaves the replica counts out"
    )


def test_the_rendered_autoscaler_options_pass_kuberays_schema(kuberay_crds: Path) -> None:
    """Every field is one KubeRay declares, in each supported release (the API server would prune a misspelt one)."""
    from test_samples import _closed

    crd = yaml.safe_load((kuberay_crds / "ray.io_rayservices.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    options = RayServiceOptions(
        name="a",
        autoscaler=AutoscalerOptions(idle_timeout_seconds=30, upscaling_mode="Aggressive", resources={}),
    )
    manifest = render_rayservice(to_model(_autoscaling_graph()), options)
    jsonschema.Draft7Validator(_closed(version["schema"]["openAPIV3Schema"])).validate(manifest)


@pytest.mark.parametrize("delay", [None, 0, 5])
def test_the_old_clusters_deletion_delay_is_kuberays_own_field_and_no_new_cluster(
    kuberay_crds: Path, delay: int | None
) -> None:
    """Unset, KubeRay keeps its 60 s; set, the field is KubeRay's (in each supported release),
    and changing it alone rewrites the RayService without building a new Ray cluster."""
    from test_samples import _closed

    ray_service = {} if delay is None else {"rayClusterDeletionDelaySeconds": delay}
    spec = parse_spec(
        {"source": {"url": "https://r/x", "tokenSecretRef": {"name": "t"}}, "rayService": ray_service}, "ns"
    )
    options = spec.rayservice_options("sg", "ns", {"uid": "u"})
    manifest = render_rayservice(to_model(graph()), options)
    assert manifest["spec"].get("rayClusterDeletionDelaySeconds") == delay
    crd = yaml.safe_load((kuberay_crds / "ray.io_rayservices.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    jsonschema.Draft7Validator(_closed(version["schema"]["openAPIV3Schema"])).validate(manifest)
    default = render_rayservice(to_model(graph()), replace(options, cluster_deletion_delay_s=None))
    assert (manifest["metadata"]["annotations"] == default["metadata"]["annotations"]) == (delay is None)
    assert manifest["spec"]["rayClusterConfig"] == default["spec"]["rayClusterConfig"]


def test_inspect_marks_streaming_nodes_and_edges() -> None:
    from servegraph.render.inspect import describe

    text = describe(load_graph(SAMPLES / "streaming.txtpb"))
    assert "  node guard: servegraph.examples:Guard  [" in text  # unary: no mark
    assert "  node gen-a: servegraph.examples:TokenGenerator (streams)  [" in text
    assert "  node pipeline: sequence (streams)  [" in text
    assert "    -> guard  (timeout 5s)\n    -> route  (stream, timeout 10s, retries 1)\n" in text
