"""The validator and the runtime judge a node alike: one rule set (servegraph.dag.rules).

A node reaches the model from the graph's protobuf (graph/nodes.py, what the operator
validates) and from a Serve config's args (dag/nodeargs.py, what the runtime builds).
Here every generated node, valid or not, of every kind, goes both ways: both must
accept it and build the same node, or both refuse it naming the same problems.
"""

from __future__ import annotations

import math
from typing import Any

from google.protobuf import json_format, struct_pb2
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from servegraph.dag.model import Node
from servegraph.dag.nodeargs import Problems, decode_node
from servegraph.graph.errors import Problem
from servegraph.graph.nodes import to_node
from servegraph.v1 import graph_pb2

# Mostly what a graph may say, some of what it may not: both verdicts come up often.
_ids = st.sampled_from(["a", "b", "c", "a", "b", "c", ""])
_timeouts = st.sampled_from([0.0, 0.5, 30.0, 0.0, 0.5, -1.0, math.nan, math.inf])
_retries = st.sampled_from([0, 1, 10, 0, 1, 11])
_optional = st.sampled_from([False, False, False, True])


@st.composite
def _refs(draw: st.DrawFn, options: bool = True) -> graph_pb2.NodeRef:
    ref = graph_pb2.NodeRef(id=draw(_ids))
    if options and draw(st.integers(0, 2)) == 0:
        ref.timeout_s, ref.retries, ref.optional = draw(_timeouts), draw(_retries), draw(_optional)
    return ref


_values = st.sampled_from([None, True, 3, "text", [1, "x"], {"k": 1}])


@st.composite
def _arguments(draw: st.DrawFn) -> graph_pb2.Argument:
    """A constant or a handle. Call options on a handle are the graph's own refusal: the args
    have no way to say them (a handle's entry is `{node: id}`), so none are drawn."""
    if draw(st.booleans()):
        return graph_pb2.Argument(node=draw(_refs(options=False)))
    value = struct_pb2.Struct()
    value.update({"v": draw(_values)})
    return graph_pb2.Argument(value=value.fields["v"])


@st.composite
def nodes(draw: st.DrawFn) -> graph_pb2.Node:
    node = graph_pb2.Node()
    kind = draw(st.sampled_from(["deployment", "sequence", "ensemble", "switch", "splitter"]))
    getattr(node, kind).SetInParent()  # set even when empty: an empty router is one of the cases
    if kind == "deployment":
        paths = ["pkg.mod:Cls", "pkg.mod.Cls", "", "no path", "pkg:" + "a" * 1100]
        node.deployment.import_path = draw(st.sampled_from(paths))
        node.deployment.args.extend(draw(st.lists(_arguments(), max_size=2)))
        for name in draw(st.lists(st.sampled_from(["x", "y", "1bad", "not valid"]), max_size=2, unique=True)):
            node.deployment.kwargs[name].CopyFrom(draw(_arguments()))
    elif kind == "sequence":
        node.sequence.steps.extend(draw(st.lists(_refs(), max_size=3)))
    elif kind == "ensemble":
        node.ensemble.members.extend(draw(st.lists(_refs(), max_size=3)))
        if draw(st.booleans()):
            node.ensemble.combiner.CopyFrom(draw(_refs()))
    elif kind == "switch":
        on = draw(st.sampled_from(["field", "header", "field", "header", None]))
        if on is not None:
            setattr(node.switch, on, draw(st.sampled_from(["kind", "X-Kind", "kind", "X-Kind", ""])))
        for _ in range(draw(st.integers(0, 3))):
            node.switch.cases.add(equals=draw(st.sampled_from(["x", "y", "z", ""])), node=draw(_refs()))
        if draw(st.integers(0, 3)):
            node.switch.default.CopyFrom(draw(_refs()))
    else:
        targets = draw(st.lists(_refs(), max_size=3))
        if targets and draw(st.booleans()):  # weights that sum to 100; otherwise left to chance
            n = len(targets) - 1
            cuts = sorted(draw(st.lists(st.integers(1, 99), min_size=n, max_size=n)))
            weights = [b - a for a, b in zip([0, *cuts], [*cuts, 100], strict=True)]
        else:
            weights = draw(
                st.lists(st.sampled_from([0, 10, 50, 90, 100]), min_size=len(targets), max_size=len(targets))
            )
        for ref, weight in zip(targets, weights, strict=True):
            node.splitter.routes.add(node=ref, weight=weight)
    return node


# -- the same node in the args' format (nodeargs' docstring), written independently of encode_node


def _options(ref: graph_pb2.NodeRef) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if ref.timeout_s:  # the schema's 0: no timeout, so not written
        out["timeout_s"] = ref.timeout_s
    if ref.retries:
        out["retries"] = ref.retries
    if ref.optional:
        out["optional"] = True
    return out


def _edge(ref: graph_pb2.NodeRef) -> Any:
    return {"node": ref.id, **_options(ref)} if _options(ref) else ref.id


def _argument(arg: graph_pb2.Argument) -> dict[str, Any]:
    if arg.WhichOneof("kind") == "node":
        return {"node": arg.node.id}
    return {"value": json_format.MessageToDict(arg.value)}


def as_args(node_id: str, msg: graph_pb2.Node) -> dict[str, Any]:
    kind = msg.WhichOneof("kind")
    body: dict[str, Any]
    if kind == "deployment":
        d = msg.deployment
        body = {"import_path": d.import_path, "args": [_argument(a) for a in d.args]}
        body["kwargs"] = {k: _argument(d.kwargs[k]) for k in d.kwargs}
    elif kind == "sequence":
        body = {"steps": [_edge(r) for r in msg.sequence.steps]}
    elif kind == "ensemble":
        body = {"members": [_edge(r) for r in msg.ensemble.members]}
        if msg.ensemble.HasField("combiner"):
            body["combiner"] = _edge(msg.ensemble.combiner)
    elif kind == "switch":
        s = msg.switch
        on = s.WhichOneof("on")
        body = {on: getattr(s, on)} if on else {}
        body["cases"] = [{"equals": c.equals, "node": c.node.id, **_options(c.node)} for c in s.cases]
        if s.HasField("default"):
            body["default"] = _edge(s.default)
    else:
        body = {"routes": [{"node": r.node.id, "weight": r.weight, **_options(r.node)} for r in msg.splitter.routes]}
    return {"id": node_id, kind: body}


def _both_ways(node_id: str, msg: graph_pb2.Node) -> tuple[Node | None, list[str], Node | None, list[str]]:
    found: list[Problem] = []
    from_graph = to_node("app", node_id, msg, found)
    graph_problems = sorted(str(p).removeprefix('application "app", ') for p in found)
    p = Problems()
    from_args = decode_node(p, "args.nodes[0]", as_args(node_id, msg))
    return from_graph, graph_problems, from_args, sorted(p.problems)


def _splitter(*routes: tuple[str, int]) -> graph_pb2.Node:
    node = graph_pb2.Node()
    for target, weight in routes:
        node.splitter.routes.add(node=graph_pb2.NodeRef(id=target), weight=weight)
    return node


@settings(max_examples=600, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["n", "n", "n", "bad#id"]), nodes())
@example("n", _splitter(("a", 100), ("b", 0)))  # a route that takes no traffic
@example("n", _splitter(("a", 50), ("a", 50)))  # the same node routed twice
def test_the_graph_and_the_args_judge_every_node_alike(node_id: str, msg: graph_pb2.Node) -> None:
    from_graph, graph_problems, from_args, args_problems = _both_ways(node_id, msg)
    verdicts = ("accepted" if from_graph else "refused", "accepted" if from_args else "refused")
    assert verdicts[0] == verdicts[1], f"graph {verdicts[0]} {graph_problems}, args {verdicts[1]} {args_problems}"
    assert graph_problems == args_problems
    if from_graph is not None:
        assert from_args == Node(from_graph.id, from_graph.kind)


def test_a_route_of_weight_zero_and_a_repeated_route_are_refused_both_ways() -> None:
    """The disagreement this rule set ended: the args accepted both, the graph refused both."""
    for msg, problem in [
        (_splitter(("a", 100), ("b", 0)), 'node "n", field splitter.routes[1].weight: must be positive, got 0'),
        (_splitter(("a", 50), ("a", 50)), 'node "n", field splitter.routes: a node is listed twice'),
    ]:
        from_graph, graph_problems, from_args, args_problems = _both_ways("n", msg)
        assert from_graph is None and from_args is None
        assert graph_problems == args_problems == [problem]
