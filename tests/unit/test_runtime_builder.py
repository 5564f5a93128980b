"""The application builder without a cluster: what it binds, and how it fails."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
from ray import cloudpickle
from ray.serve import Application
from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
from ray.serve._private.build_app import build_app

from servegraph.runtime import BuildError, build
from servegraph.runtime.builder import MAX_CHOICE_DEPTH
from servegraph.runtime.choice import SwitchChoice
from servegraph.runtime.routers import Child, GraphContext, SequenceRouter, SwitchRouter
from servegraph.runtime.serve_internals import bound

USER_CODE = """
from ray import serve

class Model:
    def __init__(self, size, *, peer=None, label="m"):
        self.size = size

def handler(payload):
    return payload

@serve.deployment(num_replicas=2)
class Ready:
    def __call__(self, payload):
        return payload

bound = Ready.bind()
CONSTANT = 3
"""


@pytest.fixture(autouse=True)
def user_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "sg_user.py").write_text(textwrap.dedent(USER_CODE))
    (tmp_path / "sg_needs_missing_dep.py").write_text("import sg_not_installed_dep\n")
    (tmp_path / "sg_raises.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))


def dep(node_id: str, import_path: str, **body: Any) -> dict[str, Any]:
    return {"id": node_id, "deployment": {"import_path": import_path, **body}}


def build_error(nodes: list[dict[str, Any]], ingress: str) -> list[str]:
    with pytest.raises(BuildError) as raised:
        build({"ingress": ingress, "nodes": nodes})
    return raised.value.problems


def test_binds_literals_and_other_nodes_and_names_deployments_after_nodes() -> None:
    app = build(
        {
            "ingress": "top",
            "nodes": [
                dep("leaf", "sg_user:Model", args=[{"value": 1}]),
                dep("top", "sg_user.Model", args=[{"value": 2}], kwargs={"peer": {"node": "leaf"}}),
            ],
        }
    )
    top = bound(app)  # Serve's own view of the bound graph
    assert top.name == "top"
    assert top.init_args == (2,)
    peer = top.init_kwargs["peer"]
    assert isinstance(peer, Application)  # Serve swaps it for leaf's DeploymentHandle
    assert bound(peer).name == "leaf"
    assert bound(peer).init_args == (1,)


def test_an_existing_deployment_keeps_its_options_under_the_node_name() -> None:
    app = build({"ingress": "r", "nodes": [dep("r", "sg_user:Ready")]})
    assert bound(app).name == "r"
    assert bound(app).num_replicas == 2


def test_routers_get_children_with_their_kind() -> None:
    app = build(
        {
            "ingress": "seq",
            "nodes": [
                dep("f", "sg_user:handler"),
                {"id": "sw", "switch": {"field": "k", "cases": [{"equals": "x", "node": "f"}], "default": "f"}},
                {"id": "seq", "sequence": {"steps": ["f", "sw"]}},
            ],
        }
    )
    seq = bound(app)
    assert seq.func_or_class is SequenceRouter
    node_id, (first, second) = seq.init_args
    assert node_id == "seq"
    assert (first.id, first.router, second.id, second.router) == ("f", False, "sw", True)
    switch = bound(second.handle)
    assert switch.func_or_class is SwitchRouter
    assert switch.init_kwargs == {"field": "k", "header": None, "context": GraphContext()}
    _, cases, default = switch.init_args
    assert [(equals, child.id) for equals, child in cases] == [("x", "f")]
    assert isinstance(default, Child) and default.id == "f"
    # The sequence decides for the switch below it and calls `f` itself (runtime/choice.py):
    # its child carries the switch's cases, each with the bound `f` and that edge's options.
    assert first.choice is None
    assert isinstance(second.choice, SwitchChoice) and second.choice.field == "k"
    assert {equals: c.id for equals, c in second.choice.cases.items()} == {"x": "f"}
    assert second.choice.default.handle is first.handle  # the same bound deployment


def test_serve_accepts_build_as_an_application_builder() -> None:
    # Serve insists on a plain function of one parameter and calls it with the args dict.
    app = call_user_app_builder_with_args_if_necessary(build, {"ingress": "f", "nodes": [dep("f", "sg_user:handler")]})
    assert bound(app).name == "f"


@pytest.mark.parametrize(
    ("import_path", "expected"),
    [
        (
            "sg_nowhere.models:Scorer",
            "node \"n\", field deployment.import_path: 'sg_nowhere.models:Scorer': module 'sg_nowhere.models' not "
            "found (is it installed in the Ray image or listed in runtime_env?)",
        ),
        (
            "sg_needs_missing_dep:Model",
            "node \"n\", field deployment.import_path: 'sg_needs_missing_dep:Model': importing 'sg_needs_missing_dep' "
            "failed: ModuleNotFoundError: No module named 'sg_not_installed_dep'",
        ),
        (
            "sg_raises:Model",
            "node \"n\", field deployment.import_path: 'sg_raises:Model': importing 'sg_raises' failed: "
            "RuntimeError: boom at import",
        ),
        (
            "sg_user:Modle",
            "node \"n\", field deployment.import_path: 'sg_user:Modle': module 'sg_user' has no attribute 'Modle'",
        ),
        (
            "sg_user:CONSTANT",
            "node \"n\", field deployment.import_path: 'sg_user:CONSTANT': is a int, not a Ray Serve deployment, a "
            "class or a function",
        ),
        (
            "sg_user:bound",
            "node \"n\", field deployment.import_path: 'sg_user:bound': is a bound Application (the result of "
            ".bind()); point it at the deployment, class or function",
        ),
    ],
)
def test_import_problems_say_what_is_missing(import_path: str, expected: str) -> None:
    assert build_error([dep("n", import_path)], "n") == [expected]


def test_a_path_of_no_module_is_refused_before_anything_is_imported() -> None:
    """By the rules the validator shares (dag/rules.py): the builder never tries `sg_user`."""
    problems = build_error([dep("n", "sg_user")], "n")
    assert (
        problems[0] == "node \"n\", field deployment.import_path: 'sg_user' is not of the form 'module.path:attribute'"
    )


def test_arguments_must_fit_the_constructor() -> None:
    found = build_error(
        [
            dep("few", "sg_user:Model"),
            dep("odd", "sg_user:Model", args=[{"value": 1}], kwargs={"colour": {"value": "red"}}),
            dep("fn", "sg_user:handler", args=[{"value": 1}]),
            {"id": "top", "sequence": {"steps": ["few", "odd", "fn"]}},
        ],
        "top",
    )
    assert found == [
        "node \"few\": arguments do not match Model(size, *, peer=None, label='m'): missing a required argument: "
        "'size'",
        "node \"odd\": arguments do not match Model(size, *, peer=None, label='m'): got an unexpected keyword "
        "argument 'colour'",
        'node "fn": handler is a function and takes no constructor arguments; use a class',
    ]  # and nothing about "top", whose children already failed


def test_shape_problems_stop_before_importing_anything() -> None:
    found = build_error([dep("a", "sg_raises:Model", args=[{"node": "ghost"}])], "a")
    assert found == ['node "a", field deployment.args[0].node: unknown node "ghost"']


def _chain(kind: str, length: int) -> dict[str, Any]:
    """`s{length-1}` → … → `s0` → `leaf`: sequences, or switches whose case and default are the same next node."""
    nodes = [dep("leaf", "sg_user:handler")]
    for i in range(length):
        below = f"s{i - 1}" if i else "leaf"
        body = {"cases": [{"equals": "x", "node": below}], "default": below, "field": "k"}
        nodes.append(
            {"id": f"s{i}", "switch": body} if kind == "switch" else {"id": f"s{i}", "sequence": {"steps": [below]}}
        )
    return {"ingress": f"s{length - 1}", "nodes": nodes}


@pytest.mark.parametrize("kind", ["sequence", "switch"])
def test_deep_graphs_bind_in_size_linear_in_their_depth(kind: str) -> None:
    # Serve pickles a deployment's arguments when it is bound, and a bound child keeps its
    # own both pickled and live: bound bottom-up, each level doubled what the ingress held
    # (14 chained sequences took 3.6 GiB, 16 chained switches 14 GiB). Bound parents first,
    # every level more costs the same (past the chain of switches one router decides).
    depths = (4, 5, 6) if kind == "sequence" else (MAX_CHOICE_DEPTH + 1, MAX_CHOICE_DEPTH + 2, MAX_CHOICE_DEPTH + 3)
    sizes = [len(cloudpickle.dumps(build(_chain(kind, n)))) for n in depths]
    first, second = sizes[1] - sizes[0], sizes[2] - sizes[1]
    assert second < first * 1.2, sizes


def test_a_long_chain_of_switches_builds_every_deployment_once() -> None:
    app = build(_chain("switch", 40))
    assert sorted(d.name for d in build_app(app, name="x").deployments) == sorted(
        ["leaf", *(f"s{i}" for i in range(40))]
    )


def test_a_router_decides_a_bounded_chain_of_switches_itself() -> None:
    app = build(_chain("switch", 20))
    _, _, default = bound(app).init_args
    links = 0
    while default.choice is not None:
        links += 1
        default = default.choice.default
    # The ingress switch's child s18 decides for s17 … down to MAX_CHOICE_DEPTH links; past
    # that, the switch there decides in its own replica.
    assert links == MAX_CHOICE_DEPTH
    assert default.id == f"s{18 - MAX_CHOICE_DEPTH}"
    assert default.router
