"""Where a stream may flow: the validator and the runtime's builder refuse the same graphs.

(The same graphs served on a real Ray: tests/e2e/test_e2e_streaming.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from builders import deployment, graph

from servegraph.dag.args import BuildError
from servegraph.dag.args import encode as encode_args
from servegraph.graph import GraphError
from servegraph.graph.validate import to_model
from servegraph.runtime.builder import build
from servegraph.runtime.serve_internals import bound
from servegraph.v1 import graph_pb2

GEN = "servegraph.examples:TokenGenerator"
FILTER = "servegraph.examples:StreamFilter"
ECHO = "servegraph.examples:Echo"


def gen(streaming: bool = True, path: str = GEN) -> graph_pb2.Node:
    node = deployment(path)
    node.deployment.streaming = streaming
    return node


def app(ingress: str, **nodes: graph_pb2.Node) -> graph_pb2.Application:
    a = graph_pb2.Application(name="app", route_prefix="/app", ingress=ingress)
    for node_id, node in nodes.items():
        a.nodes[node_id.replace("_", "-")].CopyFrom(node)
    return a


def sequence(*steps: str) -> graph_pb2.Node:
    return graph_pb2.Node(sequence=graph_pb2.Sequence(steps=[graph_pb2.NodeRef(id=s) for s in steps]))


def switch(default: str, **cases: str) -> graph_pb2.Node:
    node = graph_pb2.Node(switch=graph_pb2.Switch(header="x-model", default=graph_pb2.NodeRef(id=default)))
    for equals, node_id in cases.items():
        node.switch.cases.add(equals=equals, node=graph_pb2.NodeRef(id=node_id))
    return node


def splitter(**weights: int) -> graph_pb2.Node:
    return graph_pb2.Node(
        splitter=graph_pb2.Splitter(
            routes=[graph_pb2.WeightedRoute(node=graph_pb2.NodeRef(id=n), weight=w) for n, w in weights.items()]
        )
    )


def ensemble(*members: str, combiner: str | None = None) -> graph_pb2.Node:
    node = graph_pb2.Node(ensemble=graph_pb2.Ensemble(members=[graph_pb2.NodeRef(id=m) for m in members]))
    if combiner is not None:
        node.ensemble.combiner.id = combiner
    return node


def problems(a: graph_pb2.Application) -> list[str]:
    with pytest.raises(GraphError) as err:
        to_model(graph(a))
    return [str(p) for p in err.value.problems]


def builder_problems(a: graph_pb2.Application) -> list[str]:
    """The same application as a hand-written Serve config's args, refused by the builder."""
    a.ClearField("ingress")
    nodes: list[dict[str, Any]] = []
    # The validator refuses it, so write the args by hand in the builder's format.
    for node_id, node in a.nodes.items():
        kind = node.WhichOneof("kind")
        if kind == "deployment":
            nodes.append(
                {
                    "id": node_id,
                    "deployment": {"import_path": node.deployment.import_path, "streaming": node.deployment.streaming},
                }
            )
        elif kind == "sequence":
            nodes.append({"id": node_id, "sequence": {"steps": [s.id for s in node.sequence.steps]}})
        elif kind == "ensemble":
            nodes.append({"id": node_id, "ensemble": {"members": [m.id for m in node.ensemble.members]}})
        elif kind == "splitter":
            routes = [{"node": r.node.id, "weight": r.weight} for r in node.splitter.routes]
            nodes.append({"id": node_id, "splitter": {"routes": routes}})
    ordered = sorted(nodes, key=lambda n: "deployment" not in n)
    with pytest.raises(BuildError) as err:
        build({"ingress": ordered[-1]["id"], "nodes": ordered})
    return err.value.problems


def unary_stream_transform() -> graph_pb2.Application:
    """A unary step feeding a generator, whose items a streaming filter transforms."""
    return app(
        "chat", chat=sequence("echo", "gen", "filter"), echo=gen(False, ECHO), gen=gen(), filter=gen(path=FILTER)
    )


def test_a_sequence_ending_in_a_generator_with_a_transform_after_it_is_valid() -> None:
    g = to_model(graph(unary_stream_transform()))
    assert [n.id for n in g.applications[0].ordered_nodes()] == ["echo", "filter", "gen", "chat"]


def test_switch_and_splitter_pass_a_stream_through_when_every_child_streams() -> None:
    to_model(
        graph(
            app(
                "chat",
                chat=sequence("route"),
                route=switch("canary", b="gen-b"),
                canary=splitter(**{"gen-a": 90, "gen-b": 10}),
                gen_a=gen(),
                gen_b=gen(),
            )
        )
    )


def test_an_ensemble_refuses_a_streaming_member_and_names_it() -> None:
    found = problems(app("vote", vote=ensemble("echo", "gen"), echo=gen(False, ECHO), gen=gen()))
    assert found == [
        'application "app", node "vote", field ensemble.members[1]: member "gen" streams; '
        "an ensemble needs each member's whole answer (a combiner may stream)"
    ]


def test_a_streaming_combiner_makes_the_ensemble_stream() -> None:
    g = to_model(
        graph(
            app(
                "chat",
                chat=sequence("vote", "filter"),
                vote=ensemble("echo", combiner="gen"),
                echo=gen(False, ECHO),
                gen=gen(),
                filter=gen(path=FILTER),
            )
        )
    )
    assert g.applications[0].nodes["vote"].kind.combiner == "gen"  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", ["switch", "splitter"])
def test_children_that_disagree_are_refused_naming_both_sides(kind: str) -> None:
    router = switch("gen", a="echo") if kind == "switch" else splitter(gen=50, echo=50)
    found = problems(app("chat", chat=sequence("route"), route=router, gen=gen(), echo=gen(False, ECHO)))
    assert found == [
        f'application "app", node "route": a {kind}\'s children must all stream or none: "gen" stream, "echo" do not'
    ]


def test_a_streaming_ingress_is_refused_with_the_fix() -> None:
    [found] = problems(app("gen", gen=gen()))
    assert found.startswith('application "app", node "gen", field deployment.streaming: a streaming deployment cannot')
    assert found.endswith(
        "make the ingress a sequence with it as the one step, which serves its items over HTTP and gRPC"
    )


def test_a_stream_inside_a_streaming_sequence_under_a_switch_counts_as_streaming() -> None:
    # The inner sequence streams because its step does: the switch's children agree.
    to_model(
        graph(
            app(
                "chat",
                chat=sequence("route"),
                route=switch("inner", a="gen"),
                inner=sequence("gen", "filter"),
                gen=gen(),
                filter=gen(path=FILTER),
            )
        )
    )


@pytest.mark.parametrize(
    ("application", "expected"),
    [
        (app("vote", vote=ensemble("echo", "gen"), echo=gen(False, ECHO), gen=gen()), 'member "gen" streams'),
        (app("split", split=splitter(gen=50, echo=50), gen=gen(), echo=gen(False, ECHO)), "must all stream or none"),
    ],
)
def test_the_builder_refuses_what_the_validator_refuses(application: graph_pb2.Application, expected: str) -> None:
    [found] = builder_problems(application)
    assert expected in found


def test_streaming_travels_in_the_args_and_only_when_set() -> None:
    g = to_model(graph(app("chat", chat=sequence("echo", "gen"), echo=gen(False, ECHO), gen=gen())))
    nodes = {n["id"]: n for n in encode_args(g, g.applications[0])["nodes"]}
    assert nodes["gen"]["deployment"]["streaming"] is True
    assert "streaming" not in nodes["echo"]["deployment"]  # unary graphs' args are unchanged


def test_the_builder_tells_each_router_and_child_whether_it_streams() -> None:
    g = to_model(graph(unary_stream_transform()))
    ingress = bound(build(encode_args(g, g.applications[0])))
    assert ingress.init_kwargs["streams"] is True
    _, steps = ingress.init_args
    assert [(s.id, s.streams) for s in steps] == [("echo", False), ("gen", True), ("filter", True)]


def test_a_non_boolean_streaming_in_args_is_named() -> None:
    with pytest.raises(BuildError) as err:
        build(
            {
                "ingress": "s",
                "nodes": [
                    {"id": "g", "deployment": {"import_path": GEN, "streaming": "yes"}},
                    {"id": "s", "sequence": {"steps": ["g"]}},
                ],
            }
        )
    assert "node \"g\", field deployment.streaming: must be true or false, got 'yes'" in err.value.problems
