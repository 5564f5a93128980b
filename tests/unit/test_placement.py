"""Placement per worker group (issue 22, item 4): the graph's hints are checked as Kubernetes
would check the pods, and a ServeGraph's `workers`/`workerGroups` reach the renderer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from builders import chain_app, graph
from support import SAMPLES

from servegraph.cli.main import main
from servegraph.dag import model
from servegraph.graph import GraphError, load_graph
from servegraph.graph.validate import to_model
from servegraph.operator.spec import parse_spec, pod_overrides
from servegraph.render import RayServiceOptions, render_rayservice
from servegraph.render.inspect import describe
from servegraph.v1 import graph_pb2


def _hinted() -> tuple[graph_pb2.Graph, graph_pb2.WorkerGroupHint]:
    g = graph(chain_app(length=2))
    return g, g.cluster.worker_groups.add(name="cpu")


def test_a_valid_hint_becomes_the_models_placement() -> None:
    g, hint = _hinted()
    hint.node_selector["pool"] = "ray"
    hint.tolerations.add(operator="Exists")  # every taint: Kubernetes allows it (the policy may not)
    hint.tolerations.add(key="dedicated", value="ml", effect="NoExecute", toleration_seconds=0)
    term = hint.node_affinity.required.add()
    term.match_expressions.add(key="kubernetes.io/arch", operator="In", values=["amd64", "arm64"])
    term.match_expressions.add(key="spot", operator="DoesNotExist")
    hint.node_affinity.preferred.add(weight=100).term.match_expressions.add(key="cores", operator="Lt", values=["-3"])
    hint.priority_class_name = "serving.high"
    (placed,) = to_model(g).cluster.worker_groups
    assert placed.node_selector == (("pool", "ray"),)
    assert placed.placement == model.Placement(
        tolerations=(
            model.Toleration("", "Exists"),
            model.Toleration("dedicated", "Equal", "ml", "NoExecute", 0),
        ),
        required=(
            (
                model.NodeRequirement("kubernetes.io/arch", "In", ("amd64", "arm64")),
                model.NodeRequirement("spot", "DoesNotExist"),
            ),
        ),
        preferred=(model.PreferredNodes(100, (model.NodeRequirement("cores", "Lt", ("-3",)),)),),
        priority_class_name="serving.high",
    )


Mutate = Callable[[graph_pb2.WorkerGroupHint], object]
BAD: dict[str, tuple[Mutate, str]] = {
    "selector-key": (lambda h: h.node_selector.update({"bad key": "x"}), "node_selector key 'bad key' is not a valid"),
    "selector-value": (lambda h: h.node_selector.update({"pool": "a b"}), "node_selector['pool'] 'a b' is not a valid"),
    "toleration-operator": (lambda h: h.tolerations.add(key="k", operator="Matches"), "tolerations[0]: operator"),
    "toleration-no-key": (lambda h: h.tolerations.add(value="v"), 'an empty key (every taint) needs operator "Exists"'),
    "toleration-exists-value": (
        lambda h: h.tolerations.add(key="k", operator="Exists", value="v"),
        'value must be empty with operator "Exists"',
    ),
    "toleration-key": (lambda h: h.tolerations.add(key="-k"), "tolerations[0]: key '-k' is not a valid"),
    "toleration-effect": (lambda h: h.tolerations.add(key="k", effect="NoRun"), "effect 'NoRun' must be one of"),
    "toleration-seconds": (
        lambda h: h.tolerations.add(key="k", effect="NoSchedule", toleration_seconds=5),
        'toleration_seconds is only meaningful with effect "NoExecute"',
    ),
    "affinity-operator": (
        lambda h: h.node_affinity.required.add().match_expressions.add(key="k", operator="Like", values=["v"]),
        "node_affinity.required[0].match_expressions[0]: operator 'Like' must be one of",
    ),
    "affinity-in-without-values": (
        lambda h: h.node_affinity.required.add().match_expressions.add(key="k", operator="In"),
        "operator In needs 1 to 64 values",
    ),
    "affinity-exists-with-values": (
        lambda h: h.node_affinity.required.add().match_expressions.add(key="k", operator="Exists", values=["v"]),
        "operator Exists takes no values",
    ),
    "affinity-gt-not-integer": (
        lambda h: h.node_affinity.required.add().match_expressions.add(key="k", operator="Gt", values=["1.5"]),
        "operator Gt needs exactly one integer value",
    ),
    "affinity-bad-value": (
        lambda h: h.node_affinity.required.add().match_expressions.add(key="k", operator="NotIn", values=["a/b"]),
        "'a/b' is not a valid Kubernetes label value",
    ),
    "affinity-empty-term": (
        lambda h: h.node_affinity.required.add(),
        "node_affinity.required[0]: a node selector term needs at least one requirement",
    ),
    "affinity-weight": (
        lambda h: h.node_affinity.preferred.add(weight=0).term.match_expressions.add(key="k", operator="Exists"),
        "node_affinity.preferred[0]: weight 0 must be 1 to 100",
    ),
    "priority-class": (lambda h: setattr(h, "priority_class_name", "High_Priority"), "is not a DNS-1123 subdomain"),
    "too-many-tolerations": (
        lambda h: [h.tolerations.add(key=f"k{i}") for i in range(65)],
        "tolerations has over 64 entries",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_placement_is_a_problem_naming_the_group_and_field(case: str) -> None:
    g, hint = _hinted()
    mutate, expected = BAD[case]
    mutate(hint)
    with pytest.raises(GraphError) as err:
        to_model(g)
    assert "field cluster.worker_groups[0]" in str(err.value)
    assert expected in str(err.value)


def test_every_placement_problem_is_reported_at_once() -> None:
    g, hint = _hinted()
    hint.tolerations.add(key="k", operator="Matches")
    hint.node_affinity.preferred.add(weight=101).term.match_expressions.add(key="k", operator="In")
    hint.priority_class_name = "UPPER"
    with pytest.raises(GraphError) as err:
        to_model(g)
    assert len(err.value.problems) == 4, err.value.problems


def test_the_spec_reads_per_group_overrides_over_workers() -> None:
    toleration = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    affinity: dict[str, Any] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}
    }
    ray_service = {
        "head": {"priorityClassName": "ray-head", "affinity": {"podAffinity": {}}},
        "workers": {"nodeSelector": {"pool": "ray"}, "priorityClassName": "serving"},
        "workerGroups": {"gpu": {"tolerations": [toleration], "affinity": affinity, "priorityClassName": "gpu-high"}},
    }
    spec = parse_spec(
        {"source": {"url": "https://r/x", "tokenSecretRef": {"name": "t"}}, "rayService": ray_service}, "ns"
    )
    options = spec.rayservice_options("sg", "ns", {"uid": "u"})
    assert options.head.priority_class_name == "ray-head" and options.head.affinity == {"podAffinity": {}}
    assert options.workers.priority_class_name == "serving" and dict(options.workers.node_selector) == {"pool": "ray"}
    (name, group), *_ = options.workers.groups.items()
    assert (name, group.tolerations, group.affinity, group.priority_class_name) == (
        "gpu",
        (toleration,),
        affinity,
        "gpu-high",
    )
    # `servegraph validate/render --pods` read the same.
    assert pod_overrides(ray_service) == (options.head, options.workers)


def test_render_with_pods_places_the_named_group(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    app = chain_app(length=2)
    app.nodes["n1"].resources.num_gpus = 1
    graph_file = tmp_path / "g.pb"
    graph_file.write_bytes(graph(app).SerializeToString())
    pods = tmp_path / "sg.yaml"
    pods.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "servegraph.io/v1alpha1",
                "kind": "ServeGraph",
                "metadata": {"name": "placed"},
                "spec": {
                    "source": {"url": "https://registry.example/g", "tokenSecretRef": {"name": "token"}},
                    "rayService": {
                        "workers": {"nodeSelector": {"pool": "ray"}},
                        "workerGroups": {"gpu": {"nodeSelector": {"pool": "gpu"}, "priorityClassName": "gpu-high"}},
                    },
                },
            }
        )
    )
    assert main(["render", str(graph_file), "--format", "rayservice", "--pods", str(pods)]) == 0
    rs = yaml.safe_load(capsys.readouterr().out)
    pods_by_group = {g["groupName"]: g["template"]["spec"] for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    assert pods_by_group["gpu"]["nodeSelector"] == {"pool": "gpu"}
    assert pods_by_group["gpu"]["priorityClassName"] == "gpu-high"
    assert pods_by_group["cpu"]["nodeSelector"] == {"pool": "ray"} and "priorityClassName" not in pods_by_group["cpu"]


def test_inspect_shows_a_groups_placement() -> None:
    g, hint = _hinted()
    hint.node_selector["pool"] = "ray"
    hint.tolerations.add(key="dedicated", value="ml", effect="NoSchedule")
    hint.node_affinity.required.add().match_expressions.add(key="zone", operator="In", values=["a"])
    hint.priority_class_name = "serving"
    text = describe(to_model(g))
    assert (
        "    placed: node selector pool=ray; tolerates dedicated=ml:NoSchedule; "
        "node affinity (1 required terms, 0 preferred); priority class serving\n"
    ) in text


def test_the_complete_samples_placement_passes_kuberays_schema(kuberay_crds: Path) -> None:
    """Hints and every override layer, rendered together, are what KubeRay's CRD declares
    (a misspelt field would be pruned by the API server, silently)."""
    from test_samples import _closed

    crd = yaml.safe_load((kuberay_crds / "ray.io_rayservices.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = _closed(version["schema"]["openAPIV3Schema"])
    (sg,) = [d for d in yaml.safe_load_all((SAMPLES / "complete.yaml").read_text()) if d["kind"] == "ServeGraph"]
    head, workers = pod_overrides(sg["spec"]["rayService"])
    options = RayServiceOptions(name="complete", head=head, workers=workers)
    manifest = render_rayservice(load_graph(SAMPLES / "complete.pb"), options)
    jsonschema.Draft7Validator(schema).validate(manifest)
    (a100,) = [g for g in manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"] if g["groupName"] == "a100"]
    pod = a100["template"]["spec"]
    assert set(pod["affinity"]) == {"nodeAffinity", "podAffinity", "podAntiAffinity"}
    # Replaced per kind: the group's own nodeAffinity over the hint's and the workers'.
    group = sg["spec"]["rayService"]["workerGroups"]["a100"]["affinity"]
    assert pod["affinity"]["nodeAffinity"] == group["nodeAffinity"]
    assert pod["priorityClassName"] == "serving-gpu"
