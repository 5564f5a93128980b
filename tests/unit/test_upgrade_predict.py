"""The upgrade prediction follows KubeRay v1.6.2's rules, checked on rendered RayServices."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from builders import deployment, graph, ref

from servegraph.graph.validate import to_model
from servegraph.render import RayServiceOptions, render_rayservice
from servegraph.render.upgrade import (
    CLUSTER_IN_PLACE,
    CREATE,
    NEW_CLUSTER,
    NO_CHANGE,
    NOT_APPLIED,
    SERVE_ONLY,
    parse_quantity,
    predict,
)
from servegraph.v1 import graph_pb2


def app(threshold: float = 0.5, gpu: bool = False, custom: bool = False) -> graph_pb2.Application:
    a = graph_pb2.Application(name="sentiment", route_prefix="/s", ingress="s")
    a.nodes["t"].CopyFrom(deployment("servegraph.examples:Tokenizer", cpus=0.25))
    a.nodes["s"].CopyFrom(deployment("servegraph.examples:Sentiment", ref("t"), cpus=0.25))
    a.nodes["s"].user_config.update({"threshold": threshold})
    if custom:
        a.nodes["t"].resources.custom["fast-disk"] = 1
    return a


def gpu_app() -> graph_pb2.Application:
    a = graph_pb2.Application(name="embed", route_prefix="/e", ingress="e")
    a.nodes["e"].CopyFrom(deployment("servegraph.examples:Embedder", cpus=1))
    a.nodes["e"].resources.num_gpus = 1
    return a


def rs(*apps: graph_pb2.Application, **options: Any) -> dict[str, Any]:
    opts = RayServiceOptions(name="g", image="ray:1", **options)
    return render_rayservice(to_model(graph(*apps)), opts)


def test_first_apply_creates_a_cluster_and_counts_its_pods() -> None:
    p = predict(None, rs(app()))
    assert p.kind == CREATE
    assert p.extra_at_peak.pods == 2  # head + one CPU worker
    assert p.extra_at_peak.cpus == 2 + 4  # the head's 2 CPUs and a 4-CPU worker


def test_a_user_config_change_is_serve_only() -> None:
    p = predict(rs(app(0.5)), rs(app(0.9)))
    assert p.kind == SERVE_ONLY
    assert p.extra_at_peak.pods == 0
    assert [(c.name, c.change) for c in p.applications] == [("sentiment", "changed")]
    assert p.applications[0].details == ("deployment s: user_config",)


def test_nothing_changed() -> None:
    assert predict(rs(app()), rs(app())).kind == NO_CHANGE


def test_a_group_appended_at_the_end_updates_the_cluster_in_place() -> None:
    p = predict(rs(app()), rs(app(), gpu_app()))
    assert p.kind == CLUSTER_IN_PLACE, p.reasons
    assert p.extra_at_peak.pods == 1 and p.extra_at_peak.gpus == 1
    assert ("embed", "added") in [(c.name, c.change) for c in p.applications]


def test_a_changed_group_needs_a_new_cluster_with_both_at_the_peak() -> None:
    old, new = rs(app()), rs(app(custom=True))
    p = predict(old, new)
    assert p.kind == NEW_CLUSTER
    assert "worker group cpu changed" in p.reasons
    assert p.extra_at_peak.pods == 2  # the whole new cluster runs beside the old one
    assert "new Ray cluster" in p.summary() and "2 pods" in p.summary()


def test_replicas_tolerations_and_strategy_do_not_count() -> None:
    old = rs(app())
    new = copy.deepcopy(old)
    group = new["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    group["replicas"], group["maxReplicas"] = 3, 5
    group["template"]["spec"]["tolerations"] = [{"key": "x", "operator": "Exists"}]
    new["spec"]["upgradeStrategy"] = {"type": "NewCluster"}
    assert predict(old, new).kind == NO_CHANGE


def test_upgrade_strategy_none_leaves_the_cluster_alone() -> None:
    p = predict(rs(app()), rs(app(custom=True), upgrade_strategy="None"))
    assert p.kind == NOT_APPLIED
    assert p.extra_at_peak.pods == 0


def test_the_image_of_the_head_is_a_cluster_change() -> None:
    old = rs(app())
    new = render_rayservice(to_model(graph(app())), RayServiceOptions(name="g", image="ray:2"))
    p = predict(old, new)
    assert p.kind == NEW_CLUSTER
    assert "head group changed" in p.reasons


@pytest.mark.parametrize(
    ("text", "value"),
    [("300m", 0.3), ("2", 2.0), ("1Gi", 2**30), ("16Gi", 16 * 2**30), ("1.5", 1.5), (4, 4.0), ("500M", 5e8)],
)
def test_quantities(text: str | int, value: float) -> None:
    assert parse_quantity(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "1x", "lots", "-1"])
def test_bad_quantities_name_the_value(text: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(text)


def cpu_heavy_app() -> graph_pb2.Application:
    """A node that needs a custom resource: its own worker group would sort before 'cpu'."""
    a = graph_pb2.Application(name="batch", route_prefix="/b", ingress="b")
    a.nodes["b"].CopyFrom(deployment("servegraph.examples:Tokenizer", cpus=1))
    a.nodes["b"].resources.num_gpus = 1
    a.nodes["b"].resources.accelerator_type = "A10G"
    return a


def names(manifest: dict[str, Any]) -> list[str]:
    return [g["groupName"] for g in manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"]]


def test_a_serve_only_change_leaves_the_cluster_config_byte_identical() -> None:
    import orjson

    v1 = rs(app(0.5), gpu_app())
    v2 = rs(app(0.9), gpu_app(), previous_cluster=v1["spec"]["rayClusterConfig"])
    assert orjson.dumps(v1["spec"]["rayClusterConfig"]) == orjson.dumps(v2["spec"]["rayClusterConfig"])
    assert v1["spec"]["serveConfigV2"] != v2["spec"]["serveConfigV2"]


def test_new_groups_are_appended_so_kuberay_updates_in_place() -> None:
    v1 = rs(gpu_app())  # one group: "gpu"
    canonical = rs(gpu_app(), app(), cpu_heavy_app())  # sorted: cpu, gpu, gpu-a10g
    assert names(canonical) == ["cpu", "gpu", "gpu-a10g"]
    stable = rs(gpu_app(), app(), cpu_heavy_app(), previous_cluster=v1["spec"]["rayClusterConfig"])
    assert names(stable) == ["gpu", "cpu", "gpu-a10g"]
    assert predict(v1, canonical).kind == NEW_CLUSTER  # what sorting by name would have cost
    assert predict(v1, stable).kind == CLUSTER_IN_PLACE


def test_a_group_no_longer_used_keeps_its_place_at_zero_workers() -> None:
    v1 = rs(app(), gpu_app())
    v2 = rs(gpu_app(), previous_cluster=v1["spec"]["rayClusterConfig"])  # no CPU node any more
    assert names(v2) == ["cpu", "gpu"]
    parked = v2["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    assert (parked["replicas"], parked["minReplicas"], parked["maxReplicas"]) == (0, 0, 0)
    assert predict(v1, v2).kind in (SERVE_ONLY, NO_CHANGE)


def test_when_a_new_cluster_comes_anyway_it_starts_clean() -> None:
    v1 = rs(app(), gpu_app())
    changed = rs(gpu_app(), previous_cluster=v1["spec"]["rayClusterConfig"], ray_version="2.61.0")
    assert names(changed) == ["gpu"], "the unused cpu group is dropped with the new cluster"
    assert predict(v1, changed).kind == NEW_CLUSTER


def test_live_defaults_added_by_the_api_server_are_not_a_change() -> None:
    v1 = rs(app())
    live = copy.deepcopy(v1)
    for port in live["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]:
        port["protocol"] = "TCP"  # a CRD schema default
    live["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["numOfHosts"] = 1
    assert predict(live, rs(app(0.9))).kind == SERVE_ONLY
    v2 = rs(app(0.9), gpu_app(), previous_cluster=live["spec"]["rayClusterConfig"])
    assert predict(live, v2).kind == CLUSTER_IN_PLACE


def test_the_gpu_image_goes_only_to_gpu_groups() -> None:
    m = render_rayservice(to_model(graph(app(), gpu_app())), RayServiceOptions(name="g"))
    cluster = m["spec"]["rayClusterConfig"]
    head_image = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    images = {g["groupName"]: g["template"]["spec"]["containers"][0]["image"] for g in cluster["workerGroupSpecs"]}
    assert head_image.endswith(":0.1.0") and images["cpu"] == head_image
    assert images["gpu"] == head_image + "-gpu"


def test_incremental_upgrade_renders_its_options_and_the_autoscaler() -> None:
    from servegraph.render.rayservice import UpgradeStrategy

    strategy = UpgradeStrategy(
        "NewClusterWithIncrementalUpgrade",
        gateway_class_name="istio",
        max_surge_percent=50,
        step_size_percent=25,
        interval_seconds=30,
    )
    m = rs(app(), upgrade_strategy=strategy)
    assert m["spec"]["upgradeStrategy"] == {
        "type": "NewClusterWithIncrementalUpgrade",
        "clusterUpgradeOptions": {
            "gatewayClassName": "istio",
            "maxSurgePercent": 50,
            "stepSizePercent": 25,
            "intervalSeconds": 30,
        },
    }
    assert m["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    assert rs(app(), upgrade_strategy="None")["spec"]["upgradeStrategy"] == {"type": "None"}
