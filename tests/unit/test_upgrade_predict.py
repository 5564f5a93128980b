"""The upgrade prediction follows KubeRay's rules (v1.6.2 and v1.7.0 alike), checked on rendered RayServices."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from builders import deployment, graph, ref

from servegraph.graph.validate import to_model
from servegraph.render import RayServiceOptions, render_rayservice, upgrade
from servegraph.render.upgrade import (
    CLUSTER_IN_PLACE,
    CREATE,
    NEW_CLUSTER,
    NO_CHANGE,
    NOT_APPLIED,
    SERVE_ONLY,
    cluster_resources,
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


def test_a_quantity_read_again_is_the_same_and_a_bad_one_is_refused_again() -> None:
    """Short quantities are parsed once and remembered; a refusal is not remembered as a value,
    and a long one (a tenant's hostile spec) is parsed without being held."""
    assert parse_quantity("16Gi") == parse_quantity("16Gi") == 16 * 2**30
    for _ in range(2):
        with pytest.raises(ValueError, match="'1x'"):
            parse_quantity("1x")
    held = upgrade._short_quantity.cache_info().currsize
    assert parse_quantity("1" + "0" * 40 + "m") == pytest.approx(1e37)
    assert upgrade._short_quantity.cache_info().currsize == held


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


# -- quantities: every form Kubernetes accepts (apimachinery resource.ParseQuantity) -------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2e9", 2e9),
        ("129e6", 129e6),
        ("12E", 12e18),
        ("1.5Gi", 1.5 * 2**30),
        ("100m", 0.1),
        ("5e-3", 0.005),
        ("1E3", 1000.0),  # E followed by digits is an exponent; alone it is exa
        ("1e+3", 1000.0),
        ("+1", 1.0),
        (".5", 0.5),
        ("1.", 1.0),
        ("0", 0.0),
        ("1n", 1e-9),
        ("250u", 250e-6),
        ("1k", 1e3),
        ("3M", 3e6),
        ("2T", 2e12),
        ("1P", 1e15),
        ("1Ki", 2**10),
        ("1Mi", 2**20),
        ("2Ti", 2 * 2**40),
        ("1Pi", 2**50),
        ("1Ei", 2**60),
        ("0.5Gi", 2**29),
        ("1e999999999", float("inf")),  # an int64 exponent Kubernetes takes: past a float's range
        (2_000_000_000, 2e9),
        (0.25, 0.25),
    ],
)
def test_every_kubernetes_quantity_form(text: str | int | float, value: float) -> None:
    assert parse_quantity(text) == pytest.approx(value)


@pytest.mark.parametrize(
    "text",
    ["1K", "1ki", "1e1.5", "e3", ".", "+", " 1", "1 ", "1e", "NaN", "Infinity", "0x10", "1e9223372036854775808"],
)
def test_forms_kubernetes_refuses_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity") as info:
        parse_quantity(text)
    assert repr(text)[:20] in str(info.value)


@pytest.mark.parametrize("value", [True, None, [1], -2, -0.5])
def test_what_no_request_can_be_is_refused(value: Any) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(value)


def head_memory(memory: str, image: str = "ray:1") -> dict[str, Any]:
    from servegraph.render import PodOverrides

    head = PodOverrides(resources={"requests": {"memory": memory}, "limits": {"memory": memory}})
    return render_rayservice(to_model(graph(app())), RayServiceOptions(name="g", image=image, head=head))


@pytest.mark.parametrize("memory", ["2e9", "129e6", "12E", "1.5Gi"])
def test_a_head_memory_in_any_quantity_form_is_predicted(memory: str) -> None:
    """Two renders of one graph with a new image: the head's memory is counted, not a ValueError."""
    p = predict(head_memory(memory), head_memory(memory, image="ray:2"))
    assert p.kind == NEW_CLUSTER
    head_only = cluster_resources({"headGroupSpec": head_memory(memory)["spec"]["rayClusterConfig"]["headGroupSpec"]})
    assert p.extra_at_peak.memory_bytes >= head_only.memory_bytes == pytest.approx(parse_quantity(memory))


def test_a_request_the_api_server_will_refuse_does_not_fail_the_prediction() -> None:
    """The apply names the bad value; the prediction (advice only) counts it as nothing."""
    p = predict(head_memory("lots"), head_memory("lots", image="ray:2"))
    assert p.kind == NEW_CLUSTER
    assert p.extra_at_peak.pods == 2


# -- prediction from the structures, never from the YAML text -------------------------------------


def versions() -> list[tuple[list[graph_pb2.Application], list[graph_pb2.Application]]]:
    """(old apps, new apps): a user_config change, an app added, an app removed, a node's code changed."""
    changed = app()
    changed.nodes["t"].deployment.import_path = "servegraph.examples:Other"
    return [
        ([app(0.5)], [app(0.9)]),
        ([app()], [app(), gpu_app()]),
        ([app(), gpu_app()], [gpu_app()]),
        ([app()], [changed]),
    ]


@pytest.mark.parametrize(("before", "after"), versions(), ids=["user-config", "added", "removed", "code"])
def test_application_changes_from_the_structures_are_those_read_from_the_yaml(
    before: list[graph_pb2.Application], after: list[graph_pb2.Application], monkeypatch: pytest.MonkeyPatch
) -> None:
    from servegraph.render import render_serve_config

    old_graph, new_graph = to_model(graph(*before)), to_model(graph(*after))
    old, new = rs(*before), rs(*after)
    from_yaml = predict(old, new)  # servegraph diff against a live RayService: only its text is known
    assert from_yaml.applications

    def no_yaml(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("YAML parsed")

    monkeypatch.setattr(yaml, "load", no_yaml)
    monkeypatch.setattr(yaml, "safe_load", no_yaml)
    from_structures = predict(
        old, new, old_config=render_serve_config(old_graph), new_config=render_serve_config(new_graph)
    )
    assert from_structures == from_yaml


def test_the_operators_prediction_reads_no_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator asks for the kind and the peak only: no Serve config is parsed, whatever changed."""

    def no_yaml(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("YAML parsed")

    old, new = rs(app(0.5)), rs(app(0.9), gpu_app())
    monkeypatch.setattr(yaml, "load", no_yaml)
    monkeypatch.setattr(yaml, "safe_load", no_yaml)
    p = predict(old, new, applications=False)
    assert (p.kind, p.applications, p.extra_at_peak.gpus) == (CLUSTER_IN_PLACE, (), 1)
    assert predict(None, new, applications=False).kind == CREATE
    assert predict(old, old, applications=False).kind == NO_CHANGE
