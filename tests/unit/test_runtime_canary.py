"""The canary inside the routers, with in-process handles: the choice at the ingress (pin,
sticky key, weight, mirror), redirects to a version's copies at any depth of a router's
choice tree, the version label, the routers' own stats, the routes' codec, and what a
side application's builder gives its copies. On a real Ray: tests/e2e/test_e2e_canary.py."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from collections import Counter
from typing import Any

import pytest
from starlette.requests import Request

from servegraph.dag.args import (
    CANARY,
    LIVE,
    ROUTE_HEADER,
    Route,
    Settings,
    SettingsError,
    Sticky,
    decode_settings,
    encode_settings,
)
from servegraph.dag.model import Call, Telemetry
from servegraph.runtime import ingress
from servegraph.runtime.calls import Child
from servegraph.runtime.choice import Spread, SwitchChoice
from servegraph.runtime.ingress import Admission, bucket, choose
from servegraph.runtime.routers import SequenceRouter
from servegraph.runtime.side import as_copy
from servegraph.runtime.stats import RouteStats, StatsStore, merged, stats_answer
from servegraph.runtime.telemetry import GraphContext

GRAPH = {"servegraph": {"graph": {"name": "g", "version": "1"}}}


def _settings(weight: int = 0, mirror: int = 0, sticky: Sticky | None = None, live: Route | None = None) -> Settings:
    canary = Route("2", "a~000000000002", frozenset({"m"}), weight, mirror, 4, sticky)
    return decode_settings(encode_settings(GRAPH, live, canary, "tok"))


def _draws(*values: float) -> Any:
    it = iter(values)
    return lambda: next(it)


# -- the choice ---------------------------------------------------------------------------

PINS = [("2", CANARY), ("canary", CANARY), ("1", LIVE), ("stable", LIVE)]


@pytest.mark.parametrize(("pin", "route"), PINS)
def test_a_pin_wins_over_weight_and_is_never_mirrored(pin: str, route: str) -> None:
    settings = _settings(weight=50, mirror=100)
    assert choose(settings, "1", None, {"x-servegraph-version": pin}, _draws(99.0), _draws(0.0)) == (route, False)


def test_an_unknown_pin_is_ignored() -> None:
    settings = _settings(weight=50)
    assert choose(settings, "1", None, {"x-servegraph-version": "7"}, _draws(10.0), _draws(99.0)) == (CANARY, False)
    assert choose(settings, "1", None, {"x-servegraph-version": "7"}, _draws(60.0), _draws(99.0)) == (LIVE, False)


def test_the_live_version_pinned_by_its_own_string_after_a_promote() -> None:
    settings = _settings(weight=0, live=Route("2", "a~000000000002", frozenset({"m"})))
    assert choose(settings, "1", None, {"x-servegraph-version": "2"}, _draws(99.0), _draws()) == (CANARY, False)
    three = decode_settings(encode_settings(GRAPH, Route("2"), Route("3", weight=0), None))
    assert choose(three, "1", None, {"x-servegraph-version": "2"}, _draws(99.0), _draws()) == (LIVE, False)


def test_the_weight_is_the_canary_share_and_mirrors_copy_only_live_requests() -> None:
    settings = _settings(weight=30, mirror=20)
    rng = random.Random(7)
    split = Spread(rng.random() * 100)
    routes = Counter()
    mirrored = 0
    for _ in range(20_000):
        route, mirror = choose(settings, "1", None, {}, split, lambda: rng.random() * 100)
        routes[route] += 1
        mirrored += mirror
        assert not (mirror and route == CANARY)
    assert abs(routes[CANARY] / 20_000 - 0.30) < 0.001
    assert abs(mirrored / routes[LIVE] - 0.20) < 0.015


@pytest.mark.parametrize("weight", [1, 10, 25, 50, 90, 99])
def test_the_canary_share_is_its_weight_over_every_stretch_of_requests_and_the_versions_take_turns(
    weight: int,
) -> None:
    settings = _settings(weight=weight)
    rng = random.Random(weight)
    for start in (0.0, 37.5, 99.99, rng.random() * 100):
        split = Spread(start)
        routes = [choose(settings, "1", None, {}, split, _draws())[0] for _ in range(2_000)]
        on_canary = 0
        for n, route in enumerate(routes, 1):
            on_canary += route == CANARY
            assert abs(on_canary - n * weight / 100) <= 3, (start, n, on_canary)  # random draws: ~sqrt(n)/2
        window = routes[1000:1100]  # any stretch, not only from the start
        assert abs(window.count(CANARY) - weight) <= 3
        if weight == 50:
            assert (
                max(len(list(run)) for _, run in itertools.groupby(routes)) <= 2
            )  # turns, not runs: one version's replicas never queue behind a streak


def test_each_ingress_replica_starts_its_sequence_at_its_own_point() -> None:
    firsts = {Spread(random.Random(seed).random() * 100)() for seed in range(5)}
    assert len(firsts) == 5


@pytest.mark.parametrize("sticky", [Sticky(header="x-user"), Sticky(field="user")])
def test_a_sticky_key_stays_on_its_version_and_only_moves_to_the_canary_as_the_weight_grows(sticky: Sticky) -> None:
    keys = [f"user-{i}" for i in range(400)]

    def on_canary(weight: int) -> set[str]:
        settings = _settings(weight=weight, sticky=sticky)
        out = set()
        for key in keys:
            headers = {"x-user": key} if sticky.header else {}
            payload = {"user": key} if sticky.field else None
            seen = {choose(settings, "1", payload, headers, _draws(0.0), _draws(0.0))[0] for _ in range(3)}
            assert len(seen) == 1  # the same key, the same version, every time (the draws say canary)
            if seen == {CANARY}:
                out.add(key)
        return out

    ten, fifty = on_canary(10), on_canary(50)
    assert ten <= fifty and 0.05 < len(ten) / 400 < 0.15 and 0.42 < len(fifty) / 400 < 0.58
    assert bucket("user-1") == bucket("user-1") == int(bucket("user-1"))  # blake2b, not Python's salted hash


def test_a_request_without_the_sticky_key_takes_the_next_point_of_the_spread() -> None:
    settings = _settings(weight=50, sticky=Sticky(header="x-user"))
    assert choose(settings, "1", None, {}, _draws(10.0), _draws(99.0))[0] == CANARY
    assert choose(settings, "1", None, {}, _draws(90.0), _draws(99.0))[0] == LIVE


def test_the_route_header_is_the_ingress_alone_to_set() -> None:
    admission = Admission(random.Random(1))
    headers, _ = admission.admit(Settings(), "1", None, {ROUTE_HEADER: CANARY, "a": "b"})
    assert headers == {"a": "b"}
    headers, _ = admission.admit(_settings(weight=0), "1", None, {ROUTE_HEADER: CANARY})
    assert headers[ROUTE_HEADER] == LIVE


# -- redirects ------------------------------------------------------------------------------


class Handle:
    """A DeploymentHandle stand-in: `.options(method_name=..., stream=...)`, `.remote(...)`."""

    def __init__(self, target: Any, method: str = "__call__", calls: list[Any] | None = None) -> None:
        self.target, self.method = target, method
        self.calls = [] if calls is None else calls

    def options(self, *, method_name: str = "__call__", stream: bool = False) -> Handle:
        return Handle(self.target, method_name, self.calls)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((self.method, args))
        fn = self.target if self.method == "__call__" else getattr(self.target, self.method)
        return asyncio.ensure_future(_awaited(fn(*args, **kwargs)))


async def _awaited(value: Any) -> Any:
    return await value if asyncio.iscoroutine(value) else value


class Copy:
    """A copy in a side application: answers `servegraph_call` with its version's tag."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __call__(self, payload: Any, headers: Any = None) -> Any:
        return {**payload, "by": self.tag}


class Side:
    """Serve's `get_deployment_handle` stand-in: (node, application) → the copy there."""

    def __init__(self) -> None:
        self.made: list[tuple[str, str]] = []

    def __call__(self, node: str, app: str) -> Handle:
        self.made.append((node, app))
        return Handle(as_copy(Copy, False)(f"{node}@{app}"))


def _user(node_id: str, tag: str) -> Child:
    return Child(node_id, Handle(Copy(tag)), False)


def _router(*steps: Child) -> tuple[SequenceRouter, Side]:
    seq = SequenceRouter("front", list(steps), context=GraphContext("g", "1", Telemetry(metrics=False)))
    side = Side()
    seq.routing._make = side
    return seq, side


def _routes(canary_nodes: set[str], live_nodes: set[str] | None = None) -> dict[str, Any]:
    live = Route("2", "a~00000000000l", frozenset(live_nodes)) if live_nodes else None
    canary = Route("3", "a~00000000000c" if canary_nodes else None, frozenset(canary_nodes), weight=50)
    return encode_settings(GRAPH, live, canary, None)


async def test_a_router_calls_the_copy_of_its_route_and_its_own_child_otherwise() -> None:
    seq, side = _router(_user("m", "base"))
    assert await seq.route({}, {}) == {"by": "base"}  # no routes: as before canaries
    seq.reconfigure(_routes({"m"}, live_nodes={"m"}))
    assert await seq.route({}, {}) == {"by": "m@a~00000000000l"}  # no header: live
    assert await seq.route({}, {ROUTE_HEADER: CANARY}) == {"by": "m@a~00000000000c"}
    assert await seq.route({}, {ROUTE_HEADER: CANARY}) == {"by": "m@a~00000000000c"}
    assert side.made == [("m", "a~00000000000l"), ("m", "a~00000000000c")]  # handles made once, cached
    seq.reconfigure(_routes(set()))  # live went back to the base, the canary copies nothing here
    assert await seq.route({}, {}) == {"by": "base"} and seq.routing._handles == {}


async def test_a_copy_deep_in_the_choice_tree_is_redirected_and_the_switch_still_decides() -> None:
    grandchild = _user("m2", "base-m2")
    choice = SwitchChoice.of([("2", grandchild)], _user("m1", "base-m1"), "model", None)
    seq, _ = _router(Child("pick", Handle(None), True, Call(), False, False, choice))
    seq.reconfigure(_routes({"m2"}))
    assert await seq.route({"model": "2"}, {ROUTE_HEADER: CANARY}) == {"model": "2", "by": "m2@a~00000000000c"}
    assert await seq.route({"model": "1"}, {ROUTE_HEADER: CANARY}) == {"model": "1", "by": "base-m1"}
    assert await seq.route({"model": "2"}, {}) == {"model": "2", "by": "base-m2"}


class Recorder:
    """EdgeMetrics' interface with `at(version)`: (version, caller, node) of every call."""

    def __init__(self, version: str = "1", log: list[tuple[str, str, str]] | None = None) -> None:
        self.version, self.log = version, [] if log is None else log

    def at(self, version: str) -> Recorder:
        return Recorder(version, self.log)

    def label(self, context: Any) -> None:
        pass

    def call(self, caller: str, node: str, seconds: float) -> None:
        self.log.append((self.version, caller, node))

    def failed(self, caller: str, node: str, reason: str) -> None:
        self.log.append((self.version, f"failed:{caller}", node))


def _request(body: Any, headers: dict[str, str] | None = None) -> Request:
    raw = json.dumps(body).encode()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    pairs = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": pairs, "query_string": b""}, receive)


async def test_every_edge_is_labelled_with_the_version_that_served_the_request() -> None:
    seq, _ = _router(_user("m", "base"))
    seq.metrics = Recorder()
    seq.reconfigure(_routes({"m"}))
    await seq(_request({}, {"x-servegraph-version": "canary"}))
    await seq(_request({}, {"x-servegraph-version": "stable"}))
    assert seq.metrics.log == [("3", "front", "m"), ("3", "http", "front"), ("1", "front", "m"), ("1", "http", "front")]


class Failing:
    def __init__(self) -> None:
        self.calls = 0
        self.release = asyncio.Event()

    async def __call__(self, payload: Any) -> Any:
        self.calls += 1
        await self.release.wait()
        raise RuntimeError("the canary is broken")


async def test_a_mirror_copies_to_the_canary_never_answers_the_client_and_is_recorded_as_mirror() -> None:
    broken = Failing()
    seq, _ = _router(_user("m", "live"))
    seq.routing._make = lambda node, app: Handle(as_copy(type("B", (), {"__call__": broken.__call__}), False)())
    seq.metrics = Recorder()
    seq.reconfigure(encode_settings(GRAPH, None, Route("3", "a~00000000000c", frozenset({"m"}), 0, 100, 0), None))
    response = await seq(_request({"n": 1}))
    assert json.loads(response.body) == {"n": 1, "by": "live"}
    assert len(seq.admission.mirrors) == 1
    broken.release.set()
    await asyncio.gather(*seq.admission.mirrors)
    assert broken.calls == 1
    log = seq.metrics.log
    assert ("3", "mirror", "front") in log and ("3", "failed:mirror", "front") in log
    assert ("1", "http", "front") in log and not any(c == "failed:http" for _, c, _ in log)


async def test_mirrors_are_dropped_first_when_the_replica_is_busy_or_has_enough_in_flight() -> None:
    admission = Admission()
    gate = asyncio.Event()
    started = [admission.mirror(0, gate.wait) for _ in range(ingress.MIRRORS_IN_FLIGHT + 3)]
    assert started.count(True) == ingress.MIRRORS_IN_FLIGHT and admission.dropped == 3
    gate.set()
    await asyncio.gather(*admission.mirrors)
    admission.in_flight = 4
    assert admission.mirror(4, gate.wait) is False  # busy: its client requests reach max_ongoing_requests
    assert admission.mirror(5, gate.wait) is True


# -- stats ----------------------------------------------------------------------------------


def test_stats_are_summed_across_replicas_per_version_and_caller() -> None:
    one, two = RouteStats(), RouteStats()
    one.record("1", "clients", 0.003)
    one.record("2", "clients", 0.2, failed_node="m")
    two.record("2", "clients", 0.0004)
    two.record("2", "mirror", 0.01, failed_node="m")
    store = StatsStore()
    store.push("r1", one.snapshot())
    store.push("r2", two.snapshot())
    store.push("r2", two.snapshot())  # totals, not increments: a repeated push changes nothing
    read = store.read()
    assert read["replicas"] == 2
    clients = read["versions"]["2"]["clients"]
    assert (clients["requests"], clients["errors"], clients["failed_nodes"]) == (2, 1, {"m": 1})
    assert sum(clients["latency_ms"]["counts"]) == 2 and clients["latency_ms"]["counts"][0] == 1
    assert read["versions"]["2"]["mirror"]["errors"] == 1
    assert merged([]) == {}


class Link:
    def __init__(self) -> None:
        self.stats = RouteStats()

    async def read(self) -> dict[str, Any]:
        return {"replicas": 1, "versions": merged([self.stats.snapshot()])}


async def test_the_stats_answer_needs_the_token() -> None:
    seq, _ = _router(_user("m", "base"))
    assert (await stats_answer(None, seq.routing, "x"))[0] == 404
    seq.reconfigure(encode_settings(GRAPH, None, Route("3", weight=5), "s3cret"))
    link = Link()
    link.stats.record("3", "clients", 0.01)
    assert (await stats_answer(link, seq.routing, "wrong"))[0] == 403
    status, body = await stats_answer(link, seq.routing, "s3cret")
    assert (status, body["live"], body["canary"], body["versions"]["3"]["clients"]["requests"]) == (200, "1", "3", 1)


# -- the codec, the copies ------------------------------------------------------------------


def test_routes_round_trip_and_bad_ones_are_named() -> None:
    settings = _settings(weight=25, mirror=5, sticky=Sticky(field="user"))
    assert settings.canary is not None and (settings.canary.weight, settings.canary.sticky) == (
        25,
        Sticky(field="user"),
    )
    assert decode_settings(encode_settings(GRAPH, settings.live, settings.canary, "tok")) == settings
    bad = {"servegraph": {"routes": {"canary": {"version": "2", "weight": 101, "nodes": ["m"]}, "other": {}}}}
    with pytest.raises(SettingsError) as raised:
        decode_settings(bad)
    assert raised.value.problems == [
        "user_config.servegraph.routes.canary.nodes: needs the side application (app) that holds them",
        "user_config.servegraph.routes.canary.weight: must be a whole percent from 0 to 100, got 101",
        "user_config.servegraph.routes: unknown route 'other' (expected live or canary)",
    ]
    assert decode_settings({"threshold": 1}) == Settings()


async def test_a_copy_answers_a_redirected_call_as_a_router_would_call_its_code() -> None:
    class WithHeaders:
        def __call__(self, payload: Any, headers: dict[str, str]) -> Any:
            return [payload, headers]

    class Gen:
        async def __call__(self, payload: Any) -> Any:
            for i in range(payload):
                yield i

    def plain(payload: Any) -> Any:
        return payload * 2

    assert as_copy(WithHeaders, True)().servegraph_call(1, {"x-servegraph-route": "canary"}, {"a": "b"}) == [
        1,
        {"a": "b"},
    ]
    items = [i async for i in as_copy(Gen, False)().servegraph_stream(3, {}, {})]
    assert items == [0, 1, 2] and await as_copy(Gen, False)().servegraph_call(2, {}, {}) == [0, 1]
    assert as_copy(plain, False)().servegraph_call(4, {}, {}) == 8


def test_a_side_application_binds_its_copies_and_reaches_the_base_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two roots (two copies no copy calls) are held by the holder, which takes no CPU; the
    node below a copy that is not a copy is the base's, called by name."""
    from ray import serve
    from ray.serve._private.build_app import build_app
    from ray.serve.handle import DeploymentHandle

    from servegraph.dag.args import HOLDER
    from servegraph.runtime import build

    monkeypatch.setattr(
        serve, "get_deployment_handle", lambda node, app_name, _check_exists: DeploymentHandle(node, app_name)
    )
    args = {
        "side": {"app": "a", "copies": ["e", "s"]},
        "nodes": [
            {"id": "e", "deployment": {"import_path": "servegraph.examples:Echo"}},
            {"id": "t", "deployment": {"import_path": "servegraph.examples:Tokenizer"}},
            {
                "id": "s",
                "deployment": {"import_path": "servegraph.examples:Sentiment", "kwargs": {"tokenizer": {"node": "t"}}},
            },
        ],
    }
    built = {d.name: d for d in build_app(build(args), name="a~0123456789ab").deployments}
    assert set(built) == {HOLDER, "e", "s"}
    assert built[HOLDER].ray_actor_options["num_cpus"] == 0
    tokenizer = built["s"].init_kwargs["tokenizer"]
    assert isinstance(tokenizer, DeploymentHandle) and (tokenizer.deployment_name, tokenizer.app_name) == ("t", "a")
    assert all(hasattr(built[c].func_or_class, "servegraph_call") for c in ("e", "s"))
    single = dict(args, side={"app": "a", "copies": ["s"]}, nodes=args["nodes"][1:])
    assert {d.name for d in build_app(build(single), name="a~0123456789ab").deployments} == {"s"}
