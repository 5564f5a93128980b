"""Per-edge call options (timeout, retries, optional) and an application's telemetry:
validated with the path to the field, rendered into the args, re-checked by the runtime's decoder."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from builders import deployment, graph

from servegraph.dag.args import BuildError, decode
from servegraph.dag.model import Call, EnsembleKind, SequenceKind, Telemetry
from servegraph.graph import GraphError
from servegraph.graph.validate import to_model
from servegraph.render import serve_config_yaml
from servegraph.v1 import graph_pb2


def ensemble_app() -> graph_pb2.Application:
    """`ens` (ingress) calls `fast` and `slow` and combines with `vote`; `seq` is unused by it."""
    app = graph_pb2.Application(name="app", route_prefix="/app", ingress="top")
    for node_id in ("fast", "slow", "vote"):
        app.nodes[node_id].CopyFrom(deployment(f"pkg.mod:{node_id.title()}"))
    ens = app.nodes["ens"]
    ens.ensemble.members.add(id="fast")
    ens.ensemble.members.add(id="slow", timeout_s=0.5, retries=1, optional=True)
    ens.ensemble.combiner.id = "vote"
    app.nodes["top"].sequence.steps.add(id="ens", timeout_s=2)
    return app


def problems_of(msg: graph_pb2.Graph) -> list[str]:
    with pytest.raises(GraphError) as raised:
        to_model(msg)
    return [str(p) for p in raised.value.problems]


def test_call_options_reach_the_model_per_edge() -> None:
    model = to_model(graph(ensemble_app()))
    nodes = model.applications[0].nodes
    assert nodes["ens"].kind == EnsembleKind(
        members=("fast", "slow"), combiner="vote", calls=(Call(), Call(0.5, 1, optional=True), Call())
    )
    assert nodes["top"].kind == SequenceKind(steps=("ens",), calls=(Call(timeout_s=2.0),))


def test_edges_with_options_render_as_mappings_and_decode_back() -> None:
    model = to_model(graph(ensemble_app()))
    args = yaml.safe_load(serve_config_yaml(model))["applications"][0]["args"]
    ens = next(n for n in args["nodes"] if n["id"] == "ens")
    assert ens["ensemble"] == {
        "members": ["fast", {"node": "slow", "timeout_s": 0.5, "retries": 1, "optional": True}],
        "combiner": "vote",
    }
    decoded = {n.id: n.kind for n in decode(args).nodes}
    assert decoded["ens"] == model.applications[0].nodes["ens"].kind


def test_a_graph_without_options_renders_as_before() -> None:
    """No call options, no telemetry: the args hold only what the builder binds (the graph's
    version moved to the routers' user_config, so a republish does not rebuild the app)."""
    app = ensemble_app()
    app.nodes["ens"].ensemble.members[1].Clear()
    app.nodes["ens"].ensemble.members[1].id = "slow"
    app.nodes["top"].sequence.steps[0].timeout_s = 0
    args = yaml.safe_load(serve_config_yaml(to_model(graph(app))))["applications"][0]["args"]
    assert set(args) == {"ingress", "nodes"}
    ens = next(n for n in args["nodes"] if n["id"] == "ens")
    assert ens["ensemble"] == {"members": ["fast", "slow"], "combiner": "vote"}


def test_telemetry_is_rendered_lower_cased_and_decoded() -> None:
    app = ensemble_app()
    app.telemetry.forward_headers.extend(["X-Request-Id", "x-tenant"])
    app.telemetry.disable_metrics = True
    model = to_model(graph(app))
    assert model.applications[0].telemetry == Telemetry(forward_headers=("x-request-id", "x-tenant"), metrics=False)
    args = yaml.safe_load(serve_config_yaml(model))["applications"][0]["args"]
    assert args["telemetry"] == {"forward_headers": ["x-request-id", "x-tenant"], "metrics": False}
    assert decode(args).telemetry == model.applications[0].telemetry


def test_invalid_options_name_application_node_and_field() -> None:
    app = ensemble_app()
    app.nodes["ens"].ensemble.members[0].timeout_s = -1
    app.nodes["ens"].ensemble.members[1].retries = 11
    app.nodes["ens"].ensemble.combiner.optional = True
    app.nodes["top"].sequence.steps[0].timeout_s = float("nan")
    app.nodes["top"].sequence.steps.add(id="vote", optional=True)
    app.nodes["vote"].deployment.args.add(node=graph_pb2.NodeRef(id="fast", retries=2))
    app.telemetry.forward_headers.extend(["x-ok", "bad header", "X-OK", "TraceParent"])
    assert sorted(problems_of(graph(app))) == sorted(
        [
            'application "app", node "ens", field ensemble.members[0].timeout_s: '
            "must be a finite number of seconds ≥ 0 (0: no timeout), got -1.0",
            'application "app", node "ens", field ensemble.members[1].retries: must be an integer from 0 to 10, got 11',
            'application "app", node "ens", field ensemble.combiner.optional: '
            "only an ensemble's members may be optional (the others' output is the result)",
            'application "app", node "top", field sequence.steps[0].timeout_s: '
            "must be a finite number of seconds ≥ 0 (0: no timeout), got nan",
            'application "app", node "top", field sequence.steps[1].optional: '
            "only an ensemble's members may be optional (the others' output is the result)",
            'application "app", node "vote", field deployment.args[0].node.retries: only a router\'s edges '
            "take call options; user code calls its handles itself",
            "application \"app\", field telemetry.forward_headers[1]: 'bad header' is not an HTTP header name",
            "application \"app\", field telemetry.forward_headers[2]: 'X-OK' is listed twice",
            "application \"app\", field telemetry.forward_headers[3]: 'TraceParent' is always forwarded "
            "(W3C trace context); remove it",
        ]
    )


def _args(node: dict[str, Any], **extra: Any) -> dict[str, Any]:
    leaf = {"id": "a", "deployment": {"import_path": "m:C"}}
    return {"ingress": node["id"], "nodes": [leaf, node], **extra}


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (
            {"id": "s", "sequence": {"steps": [{"node": "a", "timeout_s": -1}]}},
            'node "s", field sequence.steps[0].timeout_s: must be a finite number of seconds ≥ 0 (0: no timeout), '
            "got -1.0",
        ),
        (
            {"id": "s", "sequence": {"steps": [{"node": "a", "timeout_s": "1"}]}},
            "node \"s\", field sequence.steps[0].timeout_s: must be a number of seconds, got '1'",
        ),
        (
            {"id": "s", "sequence": {"steps": [{"node": "a", "retries": True}]}},
            'node "s", field sequence.steps[0].retries: must be an integer from 0 to 10, got True',
        ),
        (
            {"id": "s", "sequence": {"steps": [{"node": "a", "optional": True}]}},
            'node "s", field sequence.steps[0].optional: only an ensemble\'s members may be optional',
        ),
        (
            {"id": "s", "sequence": {"steps": [{"node": "a", "deadline": 3}]}},
            "node \"s\", field sequence.steps[0]: unknown key 'deadline'",
        ),
        (
            {"id": "e", "ensemble": {"members": [{"node": "a", "optional": "yes"}]}},
            "node \"e\", field ensemble.members[0].optional: must be true or false, got 'yes'",
        ),
        (
            {"id": "p", "splitter": {"routes": [{"node": "a", "weight": 100, "retries": 11}]}},
            # Named as in the graph schema, where a route's call options sit in its NodeRef.
            'node "p", field splitter.routes[0].node.retries: must be an integer from 0 to 10, got 11',
        ),
        (
            {"id": "w", "switch": {"field": "k", "cases": [], "default": {"node": "a", "timeout_s": -2}}},
            'node "w", field switch.default.timeout_s: must be a finite number of seconds ≥ 0 (0: no timeout), got -2.0',
        ),
    ],
)
def test_the_runtime_rechecks_call_options(node: dict[str, Any], expected: str) -> None:
    with pytest.raises(BuildError) as raised:
        decode(_args(node))
    assert any(p.startswith(expected) for p in raised.value.problems), raised.value.problems


def test_a_timeout_of_zero_is_none_in_the_args_as_in_the_graph() -> None:
    node = {"id": "s", "sequence": {"steps": [{"node": "a", "timeout_s": 0}]}}
    assert decode(_args(node)).nodes[1].kind == SequenceKind(steps=("a",))


@pytest.mark.parametrize(
    ("telemetry", "expected"),
    [
        ([], "args.telemetry: must be a mapping, got list"),
        ({"forward_headers": ["X-Upper"]}, "args.telemetry.forward_headers[0]: 'X-Upper' is not a lower-case"),
        ({"forward_headers": "x-a"}, "args.telemetry.forward_headers: must be a list of header names"),
        ({"metrics": "off"}, "args.telemetry.metrics: must be true or false, got 'off'"),
        ({"sample": 1}, "args.telemetry: unknown key 'sample'"),
    ],
)
def test_the_runtime_rechecks_telemetry(telemetry: Any, expected: str) -> None:
    node = {"id": "s", "sequence": {"steps": ["a"]}}
    with pytest.raises(BuildError) as raised:
        decode(_args(node, telemetry=telemetry))
    assert any(p.startswith(expected) for p in raised.value.problems), raised.value.problems


def test_inspect_shows_the_options_of_each_edge() -> None:
    from servegraph.render.inspect import describe

    app = ensemble_app()
    app.telemetry.forward_headers.append("x-request-id")
    text = describe(to_model(graph(app)))
    assert "    -> slow  (timeout 0.5s, retries 1, optional)\n" in text
    assert "    -> fast\n" in text
    assert "    -> ens  (timeout 2s)\n" in text
    assert "  forwards headers x-request-id\n" in text
