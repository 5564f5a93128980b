"""The runtime's args codec: decoding re-checks everything the renderer promises, naming every problem."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from servegraph.dag.args import BUILDER, AppArgs, BuildError, decode, encode, graph_identity
from servegraph.dag.model import (
    Application,
    Argument,
    BoundNode,
    Call,
    Constant,
    DeploymentKind,
    EnsembleKind,
    Graph,
    Node,
    NodeKind,
    SequenceKind,
    SplitterKind,
    SwitchKind,
    Telemetry,
)
from servegraph.dag.rules import MAX_DEPTH
from servegraph.render import serve_config_yaml


def dep(node_id: str, import_path: str = "m:C", **body: Any) -> dict[str, Any]:
    return {"id": node_id, "deployment": {"import_path": import_path, **body}}


def problems(args: Any) -> list[str]:
    with pytest.raises(BuildError) as raised:
        decode(args)
    assert str(raised.value) == "\n".join(raised.value.problems)
    return raised.value.problems


def test_parses_every_node_kind_in_order() -> None:
    spec = decode(
        {
            "graph": {"name": "g", "version": "1"},
            "ingress": "root",
            "nodes": [
                dep("a", args=[{"value": 3}], kwargs={"flag": {"value": True}}),
                dep("b", kwargs={"peer": {"node": "a"}}),
                {"id": "seq", "sequence": {"steps": ["a", "b"]}},
                {"id": "ens", "ensemble": {"members": ["a", "b"], "combiner": "seq"}},
                {"id": "sw", "switch": {"header": "x-kind", "cases": [{"equals": "e", "node": "ens"}], "default": "a"}},
                {"id": "root", "splitter": {"routes": [{"node": "sw", "weight": 90}, {"node": "b", "weight": 10}]}},
            ],
        }
    )
    assert spec == AppArgs(
        ingress="root",
        nodes=(
            Node("a", DeploymentKind("m:C", args=(Constant(3),), kwargs=(("flag", Constant(True)),))),
            Node("b", DeploymentKind("m:C", kwargs=(("peer", BoundNode("a")),))),
            Node("seq", SequenceKind(("a", "b"))),
            Node("ens", EnsembleKind(("a", "b"), combiner="seq")),
            Node("sw", SwitchKind(cases=(("e", "ens"),), default="a", header="x-kind")),
            Node("root", SplitterKind((("sw", 90), ("b", 10)))),
        ),
        graph_name="g",
        graph_version="1",
    )


def test_literal_null_is_a_value_not_a_missing_argument() -> None:
    spec = decode({"ingress": "a", "nodes": [dep("a", args=[{"value": None}])]})
    assert spec.nodes[0] == Node("a", DeploymentKind("m:C", args=(Constant(None),)))


def test_reports_every_problem_at_once_naming_nodes_and_fields() -> None:
    found = problems(
        {
            "ingress": "missing",
            "nodes": [
                dep("a", kwargs={"x": {"node": "nowhere"}}),
                {"id": "s", "sequence": {"steps": []}},
                {"id": "w", "switch": {"field": "k", "header": "h", "default": "a"}},
                {"id": "p", "splitter": {"routes": [{"node": "a", "weight": 60}, {"node": "a", "weight": 30}]}},
                {"id": "e", "ensemble": {"members": ["a", "a"]}},
            ],
        }
    )
    assert found == [
        'node "a", field deployment.kwargs[\'x\'].node: unknown node "nowhere"',
        'node "s", field sequence.steps: a sequence needs at least one step',
        'node "w", field switch: set one of `field` (a JSON body key) or `header` to route on',
        'node "p", field splitter.routes: weights sum to 90, not 100',
        'node "p", field splitter.routes: a node is listed twice',
        'node "e", field ensemble.members: a member is listed twice (results are keyed by member id)',
        'args.ingress: unknown node "missing"',
    ]


def test_a_dependency_listed_after_its_user_breaks_topological_order() -> None:
    found = problems({"ingress": "b", "nodes": [dep("b", args=[{"node": "a"}]), dep("a")]})
    assert found == [
        'node "b", field deployment.args[0].node: node "a" must be listed before the nodes that use it '
        "(topological order)"
    ]


def test_cycles_are_caught_as_order_violations_and_self_references() -> None:
    assert problems({"ingress": "a", "nodes": [{"id": "a", "sequence": {"steps": ["a"]}}]}) == [
        'node "a", field sequence.steps[0]: refers to itself'
    ]
    two = problems(
        {
            "ingress": "a",
            "nodes": [{"id": "a", "sequence": {"steps": ["b"]}}, {"id": "b", "sequence": {"steps": ["a"]}}],
        }
    )
    assert two == [
        'node "a", field sequence.steps[0]: node "b" must be listed before the nodes that use it (topological order)'
    ]


def test_nodes_the_ingress_does_not_reach_are_rejected() -> None:
    # Serve would not deploy them, and their `deployments` options would then fail obscurely.
    assert problems({"ingress": "a", "nodes": [dep("a"), dep("orphan")]}) == [
        'node "orphan": not reachable from the ingress "a"; Serve would not deploy it'
    ]


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        ({"id": "a"}, 'node "a": must have exactly one of deployment, sequence, ensemble, switch, splitter, got none'),
        (
            {"id": "a", "deployment": {"import_path": "m:C"}, "sequence": {"steps": ["x"]}},
            "node \"a\": must have exactly one of deployment, sequence, ensemble, switch, splitter, got ['deployment', "
            "'sequence']",
        ),
        ({"id": "a", "router": {}}, "node \"a\": unknown key 'router'"),
        ({"id": 3, "deployment": {}}, "args.nodes[0].id: must be a node id (a string), got 3"),
        ({"id": "", "deployment": {"import_path": "m:C"}}, 'node "": id is not a deployment name Ray accepts'),
        (dep("a", import_path=""), "node \"a\", field deployment.import_path: '' is not of the form 'module.path:attr"),
        (dep("a", import_path=3), "node \"a\", field deployment.import_path: must be a 'module.path:attribute' string"),
        (dep("a", args=[3]), 'node "a", field deployment.args[0]: must be {value: <literal>} or {node: <node id>}'),
        (dep("a", kwargs={"not valid": {"value": 1}}), "deployment.kwargs['not valid']: not a Python identifier"),
        (dep("a", kwargs={"x": {"value": 1, "node": "b"}}), "node \"a\", field deployment.kwargs['x']: must be"),
        (dep("a", timeout=3), "node \"a\", field deployment: unknown key 'timeout'"),
        (
            {"id": "a", "splitter": {"routes": [{"node": "b", "weight": True}]}},
            'node "a", field splitter.routes[0].weight: must be an integer, got True',
        ),
        (
            {"id": "a", "splitter": {"routes": [{"node": "b", "weight": 100}, {"node": "c", "weight": 0}]}},
            'node "a", field splitter.routes[1].weight: must be positive, got 0',
        ),
        (
            {"id": "a", "switch": {"field": "k", "cases": [{"equals": 1, "node": "b"}], "default": "b"}},
            'node "a", field switch.cases[0].equals: must be a string, got 1',
        ),
        (
            {"id": "a", "switch": {"field": "k", "cases": []}},
            'node "a", field switch.default: missing; name the node taking requests that match no case',
        ),
    ],
)
def test_malformed_nodes_name_the_field(node: dict[str, Any], expected: str) -> None:
    found = problems({"ingress": "a", "nodes": [node]})
    assert any(expected in p for p in found), found


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], "args: must be a mapping, got list"),
        ({"nodes": [dep("a")]}, "args.ingress: must be a non-empty node id"),
        ({"ingress": "a", "nodes": []}, "args.nodes: must be a non-empty list"),
        ({"ingress": "a", "nodes": [dep("a")], "extra": 1}, "args: unknown key 'extra'"),
        ({"ingress": "a", "nodes": [dep("a"), dep("a")]}, 'node "a": defined twice'),
    ],
)
def test_malformed_args(args: Any, expected: str) -> None:
    assert any(p.startswith(expected) for p in problems(args))


# -- the codec round trip: what the renderer writes is what the runtime reads ---------

_ids = st.from_regex(r"[a-j0-9]([a-j0-9_.-]{0,4}[a-j0-9])?", fullmatch=True)  # deployment names Ray takes
_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
_json = st.recursive(
    _json_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=6
)


_calls = st.builds(
    Call,
    timeout_s=st.none() | st.floats(min_value=0.001, max_value=3600, allow_nan=False),
    retries=st.integers(0, 10),
)


def _draw_calls(draw: st.DrawFn, n: int, optional_from: int = 0) -> tuple[Call, ...]:
    """Call options for `n` edges (often none at all); the first `optional_from` may be optional."""
    if draw(st.booleans()):
        return ()
    calls = draw(st.lists(_calls, min_size=n, max_size=n))
    flags = draw(st.lists(st.booleans(), min_size=optional_from, max_size=optional_from))
    return tuple(Call(c.timeout_s, c.retries, optional=i < optional_from and flags[i]) for i, c in enumerate(calls))


@st.composite
def _kind(draw: st.DrawFn, earlier: list[str]) -> NodeKind:
    """A node kind whose children are among `earlier` and always include the last of them,
    so every node is reachable from the last one (the ingress)."""
    if not earlier:
        constants = draw(st.lists(_json.map(Constant), max_size=2))
        return DeploymentKind(import_path=draw(st.sampled_from(["m:C", "pkg.mod:Cls", "a.b.c"])), args=tuple(constants))
    last = earlier[-1]
    children = draw(st.permutations([last, *draw(st.lists(st.sampled_from(earlier), max_size=3))]))
    distinct = list(dict.fromkeys(children))
    choice = draw(st.sampled_from(["deployment", "sequence", "ensemble", "switch", "splitter"]))
    if choice == "deployment":
        args: list[Argument] = [BoundNode(c) for c in children]
        args += draw(st.lists(_json.map(Constant), max_size=2))
        shuffled = draw(st.permutations(args))
        split = draw(st.integers(0, len(shuffled)))
        names = draw(
            st.lists(
                st.from_regex(r"[a-z_][a-z0-9_]{0,5}", fullmatch=True),
                min_size=len(shuffled) - split,
                max_size=len(shuffled) - split,
                unique=True,
            )
        )
        return DeploymentKind(
            "m:C", args=tuple(shuffled[:split]), kwargs=tuple(zip(names, shuffled[split:], strict=True))
        )
    if choice == "sequence":
        return SequenceKind(steps=tuple(children), calls=_draw_calls(draw, len(children)))
    if choice == "ensemble":
        combiner = draw(st.none() | st.sampled_from(earlier))
        members = [m for m in distinct if m != combiner] or [last]
        combiner = combiner if combiner not in members else None
        calls = _draw_calls(draw, len(members) + (combiner is not None), optional_from=len(members))
        return EnsembleKind(members=tuple(members), combiner=combiner, calls=calls)
    if choice == "switch":
        equals = draw(st.lists(st.text(max_size=4), min_size=len(children), max_size=len(children), unique=True))
        cases = tuple(zip(equals, children, strict=True))
        on_header = draw(st.booleans())
        key = draw(st.text(min_size=1, max_size=5))
        return SwitchKind(
            cases=cases,
            default=draw(st.sampled_from(earlier)),
            field=None if on_header else key,
            header=key.lower() if on_header else None,
            calls=_draw_calls(draw, len(cases) + 1),
        )
    cut = sorted(
        draw(st.lists(st.integers(1, 99), min_size=len(distinct) - 1, max_size=len(distinct) - 1, unique=True))
    )
    weights = [b - a for a, b in zip([0, *cut], [*cut, 100], strict=True)]
    return SplitterKind(routes=tuple(zip(distinct, weights, strict=True)), calls=_draw_calls(draw, len(distinct)))


_telemetry = st.builds(
    Telemetry,
    forward_headers=st.lists(st.from_regex(r"x-[a-z0-9-]{1,8}", fullmatch=True), max_size=3, unique=True).map(tuple),
    metrics=st.booleans(),
)


@st.composite
def _graphs(draw: st.DrawFn) -> Graph:
    ids = draw(st.lists(_ids, min_size=1, max_size=8, unique=True))
    nodes = [Node(node_id, draw(_kind(ids[:i]))) for i, node_id in enumerate(ids)]
    app = Application(
        name="app",
        route_prefix="/app",
        ingress=ids[-1],
        nodes={n.id: n for n in nodes},
        order=tuple(ids),
        telemetry=draw(_telemetry),
    )
    return Graph(name="g", version=draw(st.text(max_size=6)), schema_version=1, applications=(app,))


@settings(max_examples=150, deadline=None)
@given(_graphs())
def test_decoding_the_rendered_args_gives_back_the_dag(graph: Graph) -> None:
    """Through the real path: the serveConfigV2 text the operator writes, parsed as Serve parses it."""
    app = graph.applications[0]
    rendered = yaml.safe_load(serve_config_yaml(graph))["applications"][0]
    assert rendered["import_path"] == BUILDER
    decoded = decode(rendered["args"])
    assert decoded == AppArgs(
        ingress=app.ingress,
        nodes=tuple(Node(n.id, n.kind) for n in app.ordered_nodes()),
        telemetry=app.telemetry,
    )
    # The graph's identity reaches every router, and only the routers, through user_config.
    for options in rendered["deployments"]:
        is_router = not isinstance(app.nodes[options["name"]].kind, DeploymentKind)
        identity = graph_identity(options.get("user_config"))
        assert identity == ((graph.name, graph.version) if is_router else (None, None))
    assert encode(graph, app) == rendered["args"]


def test_the_builder_refuses_a_graph_deeper_than_serve_can_build() -> None:
    # A hand-written Serve config obeys the validator's depth limit too (dag/rules.py).
    def chain(length: int) -> dict[str, Any]:
        nodes = [dep("n0")] + [{"id": f"n{i}", "sequence": {"steps": [f"n{i - 1}"]}} for i in range(1, length)]
        return {"ingress": f"n{length - 1}", "nodes": nodes}

    assert len(decode(chain(MAX_DEPTH)).nodes) == MAX_DEPTH
    (problem,) = problems(chain(MAX_DEPTH + 1))
    assert problem.startswith(f'node "n{MAX_DEPTH}": the graph is {MAX_DEPTH + 1} nodes deep')
