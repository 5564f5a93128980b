"""Every semantic error names the application, the node and the field, all at once."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from builders import chain_app, deployment, graph, ref

from servegraph.dag.rules import MAX_DEPTH
from servegraph.graph import GraphError, parse_graph
from servegraph.graph.decode import encode
from servegraph.graph.validate import to_model
from servegraph.v1 import graph_pb2

Mutate = Callable[[graph_pb2.Graph], None]


def _app(g: graph_pb2.Graph) -> graph_pb2.Application:
    return g.applications[0]


def unknown_ref(g: graph_pb2.Graph) -> None:
    _app(g).nodes["n1"].deployment.args.append(ref("ghost"))


def cycle(g: graph_pb2.Graph) -> None:
    _app(g).nodes["n2"].deployment.args.append(ref("n0"))


def self_ref(g: graph_pb2.Graph) -> None:
    _app(g).nodes["n1"].deployment.kwargs["me"].CopyFrom(ref("n1"))


def missing_ingress(g: graph_pb2.Graph) -> None:
    _app(g).ingress = ""


def unknown_ingress(g: graph_pb2.Graph) -> None:
    _app(g).ingress = "nowhere"


def duplicate_app(g: graph_pb2.Graph) -> None:
    g.applications.append(chain_app("app", prefix="/other"))


def duplicate_prefix(g: graph_pb2.Graph) -> None:
    g.applications.append(chain_app("second", prefix="/app"))


def unreachable(g: graph_pb2.Graph) -> None:
    _app(g).nodes["orphan"].CopyFrom(deployment("pkg.mod:Orphan"))


def bad_deployment_name(g: graph_pb2.Graph) -> None:
    _app(g).nodes["bad#name"].CopyFrom(deployment("pkg.mod:X"))
    _app(g).nodes["n2"].deployment.args.append(ref("bad#name"))


def negative_cpus(g: graph_pb2.Graph) -> None:
    _app(g).nodes["n1"].resources.num_cpus = -1


def nan_gpus(g: graph_pb2.Graph) -> None:
    _app(g).nodes["n1"].resources.num_gpus = float("nan")


def fractional_gpus(g: graph_pb2.Graph) -> None:
    _app(g).nodes["n1"].resources.num_gpus = 1.5


def accelerator_without_gpu(g: graph_pb2.Graph) -> None:
    _app(g).nodes["n1"].resources.accelerator_type = "A100"


def reserved_custom(g: graph_pb2.Graph) -> None:
    _app(g).nodes["n1"].resources.custom["GPU"] = 1


def fixed_and_autoscaling(g: graph_pb2.Graph) -> None:
    s = _app(g).nodes["n1"].scaling
    s.num_replicas = 2
    s.autoscaling.max_replicas = 3


def min_over_max(g: graph_pb2.Graph) -> None:
    a = _app(g).nodes["n1"].scaling.autoscaling
    a.min_replicas, a.max_replicas = 5, 2


def zero_replicas(g: graph_pb2.Graph) -> None:
    _app(g).nodes["n1"].scaling.num_replicas = 0


def bad_import_path(g: graph_pb2.Graph) -> None:
    _app(g).nodes["n1"].deployment.import_path = "not a path"


def no_kind(g: graph_pb2.Graph) -> None:
    _app(g).nodes["n2"].ClearField("deployment")


def splitter_weights(g: graph_pb2.Graph) -> None:
    node = _app(g).nodes["n2"]
    node.splitter.routes.add(node=graph_pb2.NodeRef(id="x"), weight=60)
    node.splitter.routes.add(node=graph_pb2.NodeRef(id="y"), weight=30)
    _app(g).nodes["x"].CopyFrom(deployment("pkg.mod:X"))
    _app(g).nodes["y"].CopyFrom(deployment("pkg.mod:Y"))


def switch_without_default(g: graph_pb2.Graph) -> None:
    node = _app(g).nodes["n2"]
    node.switch.field = "kind"
    node.switch.cases.add(equals="a", node=graph_pb2.NodeRef(id="x"))
    _app(g).nodes["x"].CopyFrom(deployment("pkg.mod:X"))


def local_working_dir(g: graph_pb2.Graph) -> None:
    _app(g).runtime_env.working_dir = "/home/me/code"


def nan_literal(g: graph_pb2.Graph) -> None:
    _app(g).nodes["n2"].deployment.kwargs["x"].value.number_value = float("inf")


CASES: list[tuple[Mutate, list[str]]] = [
    (unknown_ref, ['node "n1"', 'unknown node reference "ghost"']),
    (cycle, ["cycle between nodes", '"n0"', '"n1"', '"n2"']),
    (self_ref, ['node "n1"', "refers to itself"]),
    (missing_ingress, ['application "app"', "field ingress", "missing"]),
    (unknown_ingress, ["field ingress", 'unknown node "nowhere"']),
    (duplicate_app, ['application "app"', "field name", "duplicate application name"]),
    (duplicate_prefix, ['application "second"', "field route_prefix", 'already used by application "app"']),
    (unreachable, ['node "orphan"', 'unreachable from the ingress "n0"']),
    (bad_deployment_name, ['node "bad#name"', "deployment name", "'#'"]),
    (negative_cpus, ['node "n1"', "field resources.num_cpus", "≥ 0"]),
    (nan_gpus, ['node "n1"', "field resources.num_gpus", "finite"]),
    (fractional_gpus, ['node "n1"', "field resources.num_gpus", "fractions only up to 1"]),
    (accelerator_without_gpu, ['node "n1"', "field resources.accelerator_type", "meaningless"]),
    (reserved_custom, ['node "n1"', "field resources.custom['GPU']"]),
    (fixed_and_autoscaling, ['node "n1"', "field scaling", "exclusive"]),
    (min_over_max, ['node "n1"', "field scaling.autoscaling.min_replicas", "greater than max_replicas 2"]),
    (zero_replicas, ['node "n1"', "field scaling.num_replicas", "≥ 1"]),
    (bad_import_path, ['node "n1"', "field deployment.import_path", "module.path:attribute"]),
    (no_kind, ['node "n2"', "no kind set"]),
    (splitter_weights, ['node "n2"', "field splitter.routes", "sum to 90"]),
    (switch_without_default, ['node "n2"', "field switch.default", "missing"]),
    (local_working_dir, ['application "app"', "field runtime_env.working_dir", "remote URI"]),
    (nan_literal, ['node "n2"', "field deployment.kwargs['x']", "NaN or infinite"]),
]


@pytest.mark.parametrize(("mutate", "expected"), CASES, ids=[c[0].__name__ for c in CASES])
def test_semantic_error_names_the_problem(mutate: Mutate, expected: list[str]) -> None:
    g = graph(chain_app(length=3))
    to_model(g)  # the unmutated graph is valid, so the error below comes from the mutation
    mutate(g)
    with pytest.raises(GraphError) as err:
        parse_graph(encode(g))
    message = str(err.value)
    for fragment in expected:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_all_problems_are_reported_at_once() -> None:
    g = graph(chain_app(length=3))
    negative_cpus(g)
    unknown_ref(g)
    min_over_max(g)
    duplicate_prefix(g)
    with pytest.raises(GraphError) as err:
        to_model(g)
    fields = {p.path for p in err.value.problems}
    assert 'application "app", node "n1", field resources.num_cpus' in fields
    assert 'application "app", node "n1", field scaling.autoscaling.min_replicas' in fields
    assert 'application "second", field route_prefix' in fields
    assert any("ghost" in p.message for p in err.value.problems)


def test_unsupported_schema_version() -> None:
    g = graph()
    g.schema_version = 2
    with pytest.raises(GraphError, match="unsupported schema_version 2"):
        to_model(g)
    g.schema_version = 0
    with pytest.raises(GraphError, match="unsupported schema_version 0"):
        to_model(g)


def test_node_limit() -> None:
    g = graph(chain_app(length=5))
    assert to_model(g, max_nodes=5).node_count == 5
    with pytest.raises(GraphError, match="6 nodes, over the limit of 5"):
        to_model(graph(chain_app(length=6)), max_nodes=5)


def test_topological_order_puts_dependencies_first() -> None:
    m = to_model(graph(chain_app(length=4)))
    assert m.applications[0].order == ("n3", "n2", "n1", "n0")


def test_literals_keep_json_types() -> None:
    g = graph(chain_app(length=1))
    kwargs = g.applications[0].nodes["n0"].deployment.kwargs
    kwargs["count"].value.number_value = 3
    kwargs["ratio"].value.number_value = 0.25
    kwargs["name"].value.string_value = "x"
    kwargs["nested"].value.struct_value.update({"a": [1, 2.5, "b", None, True]})
    node = to_model(g).applications[0].nodes["n0"]
    assert node.kind.kwargs == (  # type: ignore[union-attr]
        ("count", _lit(3)),
        ("name", _lit("x")),
        ("nested", _lit({"a": [1, 2.5, "b", None, True]})),
        ("ratio", _lit(0.25)),
    )
    assert isinstance(node.kind.kwargs[0][1].value, int)  # type: ignore[union-attr]


def _lit(v: object) -> object:
    from servegraph.dag.model import Constant

    return Constant(v)


@pytest.mark.parametrize("field", ["name", "node", "import_path"])
def test_trailing_newline_is_not_accepted(field: str) -> None:
    """`$` matches before a final newline; the validator must not let "a\\n" through."""
    g = graph(chain_app(length=1))
    app = g.applications[0]
    if field == "name":
        g.name = "g\n"
    elif field == "node":
        app.nodes["n0\n"].CopyFrom(app.nodes["n0"])
        del app.nodes["n0"]
        app.ingress = "n0\n"
    else:
        app.nodes["n0"].deployment.import_path = "pkg.mod:Leaf\n"
    with pytest.raises(GraphError):
        to_model(g)


def test_a_router_takes_no_user_config() -> None:
    """A router's user_config carries the graph's version; one from the graph would be lost
    (and a router class given a config it does not expect fails in Ray)."""
    app = chain_app()
    app.nodes["seq"].sequence.steps.add().id = "n0"
    app.nodes["seq"].user_config["threshold"] = 1
    app.ingress = "seq"
    with pytest.raises(GraphError) as raised:
        to_model(graph(app))
    assert [str(p) for p in raised.value.problems] == [
        'application "app", node "seq", field user_config: only deployment nodes take a user_config; a router has none'
    ]


def test_a_graph_deeper_than_serve_can_build_is_refused_naming_its_longest_chain() -> None:
    # Ray Serve builds an application by recursion over what is bound into what; a chain
    # of 1,000 raised RecursionError inside Serve. The limit is checked here, before anything is applied.
    deepest = to_model(graph(chain_app(length=MAX_DEPTH)))
    assert len(deepest.applications[0].nodes) == MAX_DEPTH
    with pytest.raises(GraphError) as raised:
        parse_graph(encode(graph(chain_app(length=MAX_DEPTH + 1))))
    (problem,) = raised.value.problems
    assert problem.path == 'application "app", node "n0"'
    assert f"{MAX_DEPTH + 1} nodes deep" in problem.message
    assert '"n0" → "n1" → "n2" → … → ' in problem.message
    assert f'"n{MAX_DEPTH}"' in problem.message
    assert f"limit of {MAX_DEPTH}" in problem.message
