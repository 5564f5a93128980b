"""render/canary.py: which nodes run as copies, the config that runs two versions, and back.

Ray's own functions are the judge where they can be: `ServeDeploySchema` takes every
layout, and Ray's `get_app_code_version` (what decides whether Serve restarts an
application's replicas) stays the same for the base across canary start, weight steps,
promote and abort, and for the canary's side application from canary to promoted.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
from ray.serve._private.deploy_utils import get_app_code_version
from ray.serve.schema import ServeApplicationSchema, ServeDeploySchema

from servegraph.dag.args import decode_settings, decode_side
from servegraph.dag.model import (
    Application,
    Autoscaling,
    BoundNode,
    Constant,
    DeploymentKind,
    Graph,
    Node,
    NodeKind,
    Resources,
    SequenceKind,
    SwitchKind,
)
from servegraph.render import canary
from servegraph.render.canary import Copies, Refusal, Split
from servegraph.render.canary_plan import layered
from servegraph.render.serve_config import config_yaml, render_serve_config


def _user(path: str, *refs: str, value: Any = None) -> DeploymentKind:
    args = tuple(BoundNode(r) for r in refs) + ((Constant(value),) if value is not None else ())
    return DeploymentKind(import_path=path, args=args)


def _node(node_id: str, kind: NodeKind, **options: Any) -> Node:
    return Node(id=node_id, kind=kind, resources=Resources(num_cpus=0.1), **options)


def _app(name: str, ingress: str, nodes: list[Node], prefix: str | None = None) -> Application:
    by_id = {n.id: n for n in nodes}
    order = tuple(layered({i: n.edges for i, n in by_id.items()}, by_id))
    return Application(name=name, route_prefix=prefix or f"/{name}", ingress=ingress, nodes=by_id, order=order)


def _nodes(**change: NodeKind | Node | None) -> list[Node]:
    """The base's application `a`: front = sequence(enc(tok), pick); pick = switch(model: 1 → m1, else m2)."""
    kinds: dict[str, NodeKind | Node | None] = {
        "tok": _user("m:Tok"),
        "enc": _user("m:Enc", "tok"),
        "m1": _user("m:M1"),
        "m2": _user("m:M2"),
        "pick": SwitchKind(cases=(("1", "m1"),), default="m2", field="model"),
        "front": SequenceKind(steps=("enc", "pick")),
    }
    kinds.update(change)
    return [k if isinstance(k, Node) else _node(i, k) for i, k in kinds.items() if k is not None]


def _config(version: str, *apps: Application, ready: bool = True) -> dict[str, Any]:
    rendered = render_serve_config(Graph(name="g", version=version, schema_version=1, applications=apps))
    return canary.ready(rendered) if ready else rendered


def _graph(version: str, ready: bool = True, **change: NodeKind | Node | None) -> dict[str, Any]:
    return _config(version, _app("a", "front", _nodes(**change)), ready=ready)


BASE = _graph("1")


def _app_of(config: Mapping[str, Any], name: str = "a") -> dict[str, Any]:
    return next(a for a in config["applications"] if a["name"] == name)


def _deployment(app: Mapping[str, Any], name: str) -> dict[str, Any]:
    return next(d for d in app["deployments"] if d["name"] == name)


def _code_version(app: Mapping[str, Any]) -> str:
    return get_app_code_version(ServeApplicationSchema.model_validate(app))


# -- plan: which nodes are copied ---------------------------------------------------------

PLANS = [
    # (what changed, the change, copies, targets, side, unused)
    ("a leaf's code", {"m1": _user("m:M1b")}, ("m1",), {"m1"}, ("m1",), {"m1"}),
    (
        "a leaf's options only",
        {"m2": _node("m2", _user("m:M2"), max_ongoing_requests=9)},
        ("m2",),
        {"m2"},
        ("m2",),
        {"m2"},
    ),
    (
        "a node below user code: the user code is copied, the router above redirects to it",
        {"tok": _user("m:Tok2")},
        ("tok", "enc"),
        {"enc"},
        ("tok", "enc"),
        {"tok", "enc"},
    ),
    (
        "a router's cases: the router is copied; its children stay the base's, called by name",
        {"pick": SwitchKind(cases=(("1", "m2"),), default="m1", field="model")},
        ("pick",),
        {"pick"},
        ("m1", "m2", "pick"),
        {"pick"},
    ),
    (
        "a new node: it and the router that calls it",
        {
            "m3": _user("m:M3"),
            "pick": SwitchKind(cases=(("1", "m1"), ("3", "m3")), default="m2", field="model"),
        },
        ("m3", "pick"),
        {"pick"},
        ("m1", "m2", "m3", "pick"),
        {"pick"},
    ),
    (
        "a node removed: the router that called it is copied and the node is unused",
        {"m1": None, "pick": SwitchKind(cases=(), default="m2", field="model")},
        ("pick",),
        {"pick"},
        ("m2", "pick"),
        {"pick", "m1"},
    ),
    ("nothing but the version", {}, (), set(), (), set()),
    (
        "a leaf turned streaming: its output and its parent's calls change, so the parent is copied too",
        {
            "m1": DeploymentKind(import_path="m:M1", streaming=True),
            "m2": DeploymentKind(import_path="m:M2", streaming=True),
        },
        ("m1", "m2", "pick"),
        set(),
        ("m1", "m2", "pick"),
        {"m1", "m2", "pick"},
    ),
]


@pytest.mark.parametrize(
    ("change", "copies", "targets", "side", "unused"), [p[1:] for p in PLANS[:-1]], ids=[p[0] for p in PLANS[:-1]]
)
def test_plan_copies_what_differs_and_what_cannot_be_redirected(
    change: dict[str, Any], copies: tuple[str, ...], targets: set[str], side: tuple[str, ...], unused: set[str]
) -> None:
    planned = canary.plan(_app_of(BASE), _app_of(_graph("2", **change)))
    assert planned == Copies("a", copies, frozenset(targets), side, frozenset(unused))


def test_a_stream_change_that_reaches_the_ingress_is_refused() -> None:
    """m1 and m2 streaming makes pick stream, so front's last step streams: front's own
    calls change and it is the ingress."""
    _, change, *_ = PLANS[-1]
    planned = canary.plan(_app_of(BASE), _app_of(_graph("2", **change)))
    assert isinstance(planned, Refusal) and planned.reason == "IngressChanged"


def _user_ingress(tok: str) -> dict[str, Any]:
    return _config("1", _app("a", "enc", [_node("tok", _user(tok)), _node("enc", _user("m:Enc", "tok"))]))


REFUSALS = [
    (
        "the ingress router's steps",
        BASE,
        _graph("2", front=SequenceKind(steps=("pick", "enc"))),
        "IngressChanged",
        'its ingress "front" (router) changed',
    ),
    (
        "user code at the ingress, below which a node changed",
        _user_ingress("m:Tok"),
        _user_ingress("m:Tok2"),
        "IngressChanged",
        'its ingress "enc" (user code) calls a changed node',
    ),
    (
        "an application added",
        BASE,
        _config("2", _app("a", "front", _nodes()), _app("b", "x", [_node("x", _user("m:X"))])),
        "ApplicationAdded",
        '"b" is new',
    ),
    (
        "the route prefix",
        BASE,
        _config("2", _app("a", "front", _nodes(), prefix="/other")),
        "ApplicationChanged",
        "route_prefix changed",
    ),
    (
        "the base deployed without autoscaling configs",
        _graph("1", ready=False),
        _graph("2", m1=_user("m:M1b")),
        "BaseNotReady",
        'node "m1" without an autoscaling_config',
    ),
]


@pytest.mark.parametrize(("base", "new", "reason", "says"), [r[1:] for r in REFUSALS], ids=[r[0] for r in REFUSALS])
def test_refusals_name_the_application_and_why(
    base: dict[str, Any], new: dict[str, Any], reason: str, says: str
) -> None:
    refusal = canary.plan_config(base, new)
    assert isinstance(refusal, Refusal)
    assert (refusal.reason, says in refusal.message) == (reason, True), refusal.message
    with pytest.raises(canary.CanaryRefused) as raised:
        canary.layout(base, None, new, Split(weight=10))
    assert raised.value.refusal == refusal


def test_an_application_removed_is_refused() -> None:
    two = _config("1", _app("a", "front", _nodes()), _app("b", "x", [_node("x", _user("m:X"))]))
    refusal = canary.plan_config(canary.ready(two), BASE)
    assert isinstance(refusal, Refusal) and (refusal.app, refusal.reason) == ("b", "ApplicationRemoved")


# -- layout: the config that runs them -----------------------------------------------------


def _canary_at(weight: int, **change: Any) -> dict[str, Any]:
    return canary.layout(
        BASE, None, _graph("2", **change), Split(weight=weight, mirror=20, sticky_header="X-User", stats="t0k")
    )


def test_a_canary_adds_a_side_application_and_routes_and_leaves_the_base_as_built() -> None:
    out = _canary_at(30, m1=_user("m:M1b"))
    ServeDeploySchema.model_validate(out)  # Ray's schema takes it: route_prefix null, the ZERO form
    base, side = out["applications"]
    assert side["name"].startswith("a~") and canary.side_app(side["name"]) == ("a", side["name"][2:])
    assert side["route_prefix"] is None
    assert decode_side(side["args"]).copies == {"m1"}
    assert [d["name"] for d in side["deployments"]] == ["m1"]
    assert base["args"] == _app_of(BASE)["args"] and _code_version(base) == _code_version(_app_of(BASE))
    front = decode_settings(_deployment(base, "front")["user_config"])
    assert front.canary is not None and front.live is None
    assert (front.canary.app, front.canary.nodes, front.canary.weight, front.canary.mirror) == (
        side["name"],
        {"m1"},
        30,
        20,
    )
    assert front.canary.sticky is not None and front.canary.sticky.header == "x-user"
    assert (front.canary.version, front.canary.busy, front.stats) == ("2", 5, "t0k")
    pick = decode_settings(_deployment(base, "pick")["user_config"])
    assert pick.canary is not None and (pick.canary.weight, pick.canary.app, pick.stats) == (0, side["name"], None)
    # Every base node still serves live: nothing scaled to zero.
    assert all(d["autoscaling_config"]["min_replicas"] == 1 for d in base["deployments"])


def test_weight_steps_change_only_the_ingress_user_config() -> None:
    ten, fifty = _canary_at(10, m1=_user("m:M1b")), _canary_at(50, m1=_user("m:M1b"))
    changed = [
        (a["name"], d["name"])
        for a, b in zip(ten["applications"], fifty["applications"], strict=True)
        for d, e in zip(a["deployments"], b["deployments"], strict=True)
        if d != e
    ]
    assert changed == [("a", "front")]
    assert canary.weighted(ten, Split(weight=50, mirror=20, sticky_header="x-user", stats="t0k")) == fifty


def test_promote_keeps_the_canary_side_application_and_scales_unused_base_nodes_to_zero() -> None:
    running = _canary_at(50, tok=_user("m:Tok2"))
    side = running["applications"][1]
    promoted = canary.promoted(running)
    ServeDeploySchema.model_validate(promoted)
    base, kept = promoted["applications"]
    assert kept == side and _code_version(kept) == _code_version(side)  # the canary's replicas keep running
    assert _code_version(base) == _code_version(_app_of(BASE))  # and the base's
    zero = {
        d["name"]
        for d in base["deployments"]
        if d["autoscaling_config"]["max_replicas"] == 1 and d["autoscaling_config"]["min_replicas"] == 0
    }
    assert zero == {"tok", "enc"}
    front = decode_settings(_deployment(base, "front")["user_config"])
    assert (
        front.canary is None and front.live is not None and (front.live.app, front.live.version) == (side["name"], "2")
    )
    assert set(front.scaled) == {"tok", "enc"}  # the originals, for a version that uses them again


def test_promote_with_drain_keeps_the_old_live_side_application_until_settled() -> None:
    live = canary.promoted(_canary_at(50, m1=_user("m:M1b")))
    old_side = live["applications"][1]["name"]
    second = canary.layout(*_state_versions(live), _graph("3", m1=_user("m:M1c")), Split(weight=10))
    assert [a["name"] for a in second["applications"]][1] == old_side and len(second["applications"]) == 3
    draining = canary.promoted(second, drain=True)
    assert old_side in [a["name"] for a in draining["applications"]]
    assert canary.read(draining).retiring == (old_side,)
    settled = canary.settled(draining)
    assert old_side not in [a["name"] for a in settled["applications"]]
    assert settled == canary.promoted(second)


def _state_versions(config: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    state = canary.read(config)
    return state.base, state.live


def test_abort_removes_the_canary_and_leaves_the_base_as_rendered() -> None:
    running = _canary_at(50, m1=_user("m:M1b"))
    assert canary.aborted(running) == BASE
    draining = canary.aborted(running, drain=True)
    assert [a["name"] for a in draining["applications"]] == [a["name"] for a in running["applications"]]
    assert canary.settled(draining) == BASE


def test_a_version_reverting_a_node_scales_it_back_up() -> None:
    """Live replaced m1 (so the base's m1 runs no replica); a canary that goes back to the
    base's m1 uses it again: scaled back to its original replicas while the canary runs."""
    live = canary.promoted(_canary_at(50, m1=_user("m:M1b")))
    assert _deployment(_app_of(live), "m1")["autoscaling_config"]["max_replicas"] == 1
    assert _deployment(_app_of(live), "m1")["autoscaling_config"]["min_replicas"] == 0
    base, live_version = _state_versions(live)
    back = canary.layout(base, live_version, _graph("3"), Split(weight=10))
    assert (
        _deployment(_app_of(back), "m1")["autoscaling_config"] == _deployment(_app_of(BASE), "m1")["autoscaling_config"]
    )
    front = decode_settings(_deployment(_app_of(back), "front")["user_config"])
    assert front.canary is not None and (front.canary.app, front.canary.version) == (None, "3")
    assert front.live is not None and front.live.nodes == {"m1"}


def test_fixed_replicas_become_a_pinned_autoscaling_config() -> None:
    plain = _graph("1", ready=False, m1=_node("m1", _user("m:M1"), num_replicas=3))
    assert _deployment(_app_of(plain), "m1")["num_replicas"] == 3
    pinned = _deployment(_app_of(canary.ready(plain)), "m1")
    assert pinned["autoscaling_config"] == {"min_replicas": 3, "max_replicas": 3, "initial_replicas": 3}
    assert "num_replicas" not in pinned and list(pinned)[:2] == ["name", "autoscaling_config"]
    auto = _node("m1", _user("m:M1"), autoscaling=Autoscaling(min_replicas=1, max_replicas=4))
    assert _deployment(_app_of(canary.ready(_graph("1", ready=False, m1=auto))), "m1")["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 4,
    }
    # The renderer's plain form and the pinned one are the same node to plan: nothing copied.
    assert canary.plan(_app_of(BASE), _app_of(_graph("2", ready=False))) == Copies("a")


# -- read, determinism ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"m1": _user("m:M1b")},
        {"tok": _user("m:Tok2")},
        {"m3": _user("m:M3"), "pick": SwitchKind(cases=(("1", "m1"), ("3", "m3")), default="m2", field="model")},
    ],
)
def test_read_gives_back_the_versions_the_layout_was_made_of(change: dict[str, Any]) -> None:
    new = _graph("2", **change)
    split = Split(weight=25, mirror=5, sticky_field="user", stats="s")
    out = canary.layout(BASE, None, new, split)
    state = canary.read(out)
    assert (state.base, state.live, state.base_version, state.live_version, state.canary_version) == (
        BASE,
        None,
        "1",
        "1",
        "2",
    )
    assert state.split == split
    assert state.canary is not None and canary.plan(_app_of(BASE), _app_of(state.canary)) == canary.plan(
        _app_of(BASE), _app_of(new)
    )
    assert canary.layout(state.base, state.live, state.canary, state.split) == out


def test_the_layout_is_deterministic_to_the_byte() -> None:
    new = _graph("2", tok=_user("m:Tok2"))
    texts = {
        config_yaml(canary.layout(copy.deepcopy(BASE), None, copy.deepcopy(new), Split(weight=10))) for _ in range(3)
    }
    assert len(texts) == 1
    # The same copies are the same side application, under either route.
    as_canary = canary.layout(BASE, None, new, Split(weight=10))["applications"][1]
    as_live = canary.layout(BASE, new, None, None)["applications"][1]
    assert as_canary == as_live


def test_side_app_names() -> None:
    assert canary.side_app("fraud~0123456789ab") == ("fraud", "0123456789ab")
    assert canary.side_app("fraud") is None and canary.side_app("fraud~0123") is None


def test_the_bench_runs_the_same_graph_with_and_without_a_canary() -> None:
    """bench/canary_bench.py's config: `plain` alone, and `canary` and `canary0` (the same graph)
    with version 2's echo-b beside it at 50 % and 0 %: one side application each, one copy; and
    `plain2r`, the plain graph with echo-b on two replicas."""
    from bench_modules import load

    config = load("canary_bench").config(8123)
    ServeDeploySchema.model_validate(config)
    names = [a["name"] for a in config["applications"]]
    assert (names[:2], names[3], names[5:], len(names)) == (["plain", "canary"], "canary0", ["plain2", "plain2r"], 7)
    assert canary.side_app(names[2]) == ("canary", names[2][-12:]) and canary.side_app(names[4]) is not None
    assert decode_side(config["applications"][2]["args"]).copies == {"echo-b"}
    front = decode_settings(_deployment(config["applications"][1], "front")["user_config"])
    assert front.canary is not None and front.canary.weight == 50
    assert _app_of(config, "plain")["args"]["nodes"] == _app_of(config, "canary")["args"]["nodes"]
    # ready() pins a fixed count as an autoscaling range, which a canary can scale
    echo_b = {
        a["name"]: _deployment(a, "echo-b")["autoscaling_config"]["min_replicas"] for a in config["applications"][5:]
    }
    assert echo_b == {"plain2": 1, "plain2r": 2}, "the spread variant serves echo-b on two replicas, as the canary"


def test_a_canary_back_to_the_base_is_a_canary_too_and_promoting_it_gives_the_base_as_rendered() -> None:
    """After live moved to version 2, version 1 (the base's own content) as a canary copies
    nothing; it is still chosen by weight, labelled and promoted, and its promotion is the
    base alone, every node scaled back up, no side application left."""
    live = canary.promoted(_canary_at(50, m1=_user("m:M1b")))
    base, live_version = _state_versions(live)
    back = canary.layout(base, live_version, _graph("1"), Split(weight=50))
    front = decode_settings(_deployment(_app_of(back), "front")["user_config"])
    assert front.canary is not None and (front.canary.version, front.canary.app, front.canary.weight) == ("1", None, 50)
    assert canary.read(back).canary_version == "1"
    assert canary.promoted(back) == BASE
