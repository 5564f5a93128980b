"""The builder's args check: everything the renderer promises, re-checked with every problem named."""

from __future__ import annotations

from typing import Any

import pytest

from servegraph.runtime.spec import (
    AppSpec,
    BuildError,
    DeploymentNode,
    EnsembleNode,
    Literal,
    Ref,
    SequenceNode,
    SplitterNode,
    SwitchNode,
    parse_args,
)


def dep(node_id: str, import_path: str = "m:C", **body: Any) -> dict[str, Any]:
    return {"id": node_id, "deployment": {"import_path": import_path, **body}}


def problems(args: Any) -> list[str]:
    with pytest.raises(BuildError) as raised:
        parse_args(args)
    assert str(raised.value) == "\n".join(raised.value.problems)
    return raised.value.problems


def test_parses_every_node_kind_in_order() -> None:
    spec = parse_args(
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
    assert spec == AppSpec(
        ingress="root",
        nodes=(
            DeploymentNode("a", "m:C", args=(Literal(3),), kwargs=(("flag", Literal(True)),)),
            DeploymentNode("b", "m:C", kwargs=(("peer", Ref("a")),)),
            SequenceNode("seq", ("a", "b")),
            EnsembleNode("ens", ("a", "b"), combiner="seq"),
            SwitchNode("sw", cases=(("e", "ens"),), default="a", header="x-kind"),
            SplitterNode("root", (("sw", 90), ("b", 10))),
        ),
    )


def test_literal_null_is_a_value_not_a_missing_argument() -> None:
    spec = parse_args({"ingress": "a", "nodes": [dep("a", args=[{"value": None}])]})
    assert spec.nodes[0] == DeploymentNode("a", "m:C", args=(Literal(None),))


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
        'node "a", field deployment.kwargs.x.node: unknown node "nowhere"',
        'node "s", field sequence.steps: must be a non-empty list of node ids',
        'node "w", field switch: must have exactly one of field, header',
        'node "p", field splitter.routes: weights must sum to 100, got 90',
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
        ({"id": "", "deployment": {}}, "args.nodes[0].id: must be a non-empty node id, got ''"),
        (dep("a", import_path=""), "node \"a\", field deployment.import_path: must be a non-empty 'module:attribute'"),
        (dep("a", args=[3]), 'node "a", field deployment.args[0]: must be {value: <literal>} or {node: <node id>}'),
        (dep("a", kwargs={"not valid": {"value": 1}}), "'not valid' is not a valid keyword argument name"),
        (dep("a", kwargs={"x": {"value": 1, "node": "b"}}), 'node "a", field deployment.kwargs.x: must be'),
        (dep("a", timeout=3), "node \"a\", field deployment: unknown key 'timeout'"),
        (
            {"id": "a", "splitter": {"routes": [{"node": "b", "weight": True}]}},
            'node "a", field splitter.routes[0].weight: must be a non-negative integer, got True',
        ),
        (
            {"id": "a", "switch": {"field": "k", "cases": [{"equals": 1, "node": "b"}], "default": "b"}},
            'node "a", field switch.cases[0].equals: must be a string, got 1',
        ),
        (
            {"id": "a", "switch": {"field": "k", "cases": []}},
            'node "a", field switch.default: must be a non-empty node',
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
