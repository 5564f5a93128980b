"""Router semantics and the payload rules, with in-process handles instead of a cluster."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from starlette.requests import Request

from servegraph.runtime.payload import normalize_headers, payload_from_body, switch_value
from servegraph.runtime.routers import (
    Child,
    EnsembleRouter,
    Router,
    SequenceRouter,
    SplitterRouter,
    SwitchRouter,
    json_response,
)


class Handle:
    """Stands in for a DeploymentHandle: `.remote()` → `__call__`, `.options(method_name=...)` → that method."""

    def __init__(self, target: Any, method: str = "__call__") -> None:
        self.target, self.method = target, method
        self.calls: list[tuple[Any, ...]] = []

    def options(self, *, method_name: str) -> Handle:
        other = Handle(self.target, method_name)
        other.calls = self.calls
        return other

    def remote(self, *args: Any) -> Any:
        self.calls.append((self.method, *args))
        fn = self.target if self.method == "__call__" else getattr(self.target, self.method)

        async def run() -> Any:
            result = fn(*args)
            return await result if asyncio.iscoroutine(result) else result

        return run()


def user(node_id: str, fn: Callable[[Any], Any]) -> Child:
    return Child(id=node_id, handle=Handle(fn), router=False)


def router(node_id: str, target: Router) -> Child:
    return Child(id=node_id, handle=Handle(target), router=True)


def http_request(body: bytes, headers: dict[str, str] | None = None) -> Request:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw, "query_string": b""}, receive)


@pytest.mark.parametrize(
    ("body", "payload"),
    [
        (b'{"a": [1, 2]}', {"a": [1, 2]}),
        (b"3", 3),
        (b'"quoted"', "quoted"),
        (b"null", None),
        (b"plain words", "plain words"),
        (b"{broken", "{broken"),
        ("grüße".encode(), "grüße"),
        (b"\xff\xfe", "\ufffd\ufffd"),
        (b"", None),
    ],
)
def test_payload_is_json_else_text_else_none(body: bytes, payload: Any) -> None:
    assert payload_from_body(body) == payload


def test_headers_are_lower_cased_and_the_first_value_wins() -> None:
    assert normalize_headers([("X-Kind", "a"), ("x-kind", "b"), ("Accept", "*/*")]) == {"x-kind": "a", "accept": "*/*"}


@pytest.mark.parametrize(
    ("payload", "value"),
    [
        ({"k": "fast"}, "fast"),
        ({"k": True}, "true"),
        ({"k": None}, "null"),
        ({"k": 3}, "3"),
        ({"k": 2.5}, "2.5"),
        ({"k": {"nested": 1}}, None),
        ({"k": [1]}, None),
        ({"other": "x"}, None),
        ("k", None),
        (["k"], None),
    ],
)
def test_switch_field_values(payload: Any, value: str | None) -> None:
    assert switch_value(payload, {}, field="k", header=None) == value


def test_switch_header_value_ignores_the_payload() -> None:
    headers = normalize_headers([("X-Variant", "B")])
    assert switch_value({"x-variant": "a"}, headers, field=None, header="X-Variant") == "B"
    assert switch_value({}, {}, field=None, header="x-variant") is None


async def test_sequence_feeds_each_output_to_the_next_step() -> None:
    seq = SequenceRouter("seq", [user("a", lambda p: [*p, "a"]), user("b", lambda p: [*p, "b"])])
    assert await seq.route([], {}) == ["a", "b"]


async def test_ensemble_calls_members_concurrently_and_keys_results_by_id() -> None:
    both_running = asyncio.Event()
    running = 0

    async def member(payload: int) -> int:
        nonlocal running
        running += 1
        if running == 2:
            both_running.set()
        await asyncio.wait_for(both_running.wait(), timeout=5)  # deadlocks if called one after the other
        return payload * 2

    ens = EnsembleRouter("ens", [user("x", member), user("y", member)])
    assert await ens.route(4, {}) == {"x": 8, "y": 8}


async def test_ensemble_combiner_gets_the_dict_of_results() -> None:
    combiner = user("sum", lambda parts: sum(parts.values()))
    ens = EnsembleRouter("ens", [user("x", lambda p: p + 1), user("y", lambda p: p * 10)], combiner)
    assert await ens.route(2, {}) == 23
    assert combiner.handle.calls == [("__call__", {"x": 3, "y": 20})]


async def test_switch_picks_case_or_default_and_passes_headers_to_router_children() -> None:
    inner = SwitchRouter("inner", [("b", user("tag-b", lambda p: "b"))], user("tag-a", lambda p: "a"), header="x-v")
    outer = SwitchRouter(
        "outer",
        [("tagged", router("inner", inner)), ("tagged", user("shadowed", lambda p: "never"))],
        user("echo", lambda p: ("echo", p)),
        field="kind",
    )
    assert await outer.route({"kind": "tagged"}, {"x-v": "b"}) == "b"
    assert await outer.route({"kind": "tagged"}, {}) == "a"
    assert await outer.route({"kind": "other"}, {"x-v": "b"}) == ("echo", {"kind": "other"})
    assert await outer.route("text", {}) == ("echo", "text")


async def test_user_children_get_only_the_payload_and_routers_get_route() -> None:
    leaf = user("leaf", lambda p: p)
    inner = SequenceRouter("inner", [leaf])
    inner_child = router("inner", inner)
    await SequenceRouter("outer", [inner_child]).route({"q": 1}, {"h": "v"})
    assert inner_child.handle.calls == [("route", {"q": 1}, {"h": "v"})]
    assert leaf.handle.calls == [("__call__", {"q": 1})]


async def test_splitter_follows_the_weights_over_every_stretch_of_requests() -> None:
    splitter = SplitterRouter("split", [(user("stable", lambda p: "s"), 90), (user("canary", lambda p: "c"), 10)])
    picks = [await splitter.route(None, {}) for _ in range(10_000)]
    for n in range(1, 10_001):
        assert abs(picks[:n].count("c") - n / 10) <= 4, n  # random draws: ~15 at 10,000
    three = SplitterRouter("s3", [(user(k, lambda p, k=k: k), w) for k, w in (("a", 20), ("b", 30), ("c", 50))])
    counts = Counter([await three.route(None, {}) for _ in range(1_000)])
    assert all(abs(counts[k] - w * 10) <= 4 for k, w in (("a", 20), ("b", 30), ("c", 50))), counts
    never = SplitterRouter("split", [(user("a", lambda p: "a"), 100), (user("b", lambda p: "b"), 0)])
    assert {await never.route(None, {}) for _ in range(200)} == {"a"}


async def test_a_router_at_the_ingress_answers_http_with_json() -> None:
    switch = SwitchRouter(
        "sw", [("x", user("x", lambda p: {"got": p}))], user("d", lambda p: {"default": p}), field="k"
    )
    response = await switch(http_request(b'{"k": "x"}'))
    assert response.status_code == 200
    assert response.media_type == "application/json"
    assert json.loads(response.body) == {"got": {"k": "x"}}
    response = await switch(http_request(b"not json"))
    assert json.loads(response.body) == {"default": "not json"}


async def test_a_router_called_through_a_handle_returns_python_values() -> None:
    seq = SequenceRouter("seq", [user("a", lambda p: {"seen": p})])
    assert await seq({"q": 1}) == {"seen": {"q": 1}}


async def test_header_switch_at_the_ingress_reads_request_headers() -> None:
    switch = SwitchRouter("sw", [("b", user("b", lambda p: "b"))], user("a", lambda p: "a"), header="x-variant")
    assert json.loads((await switch(http_request(b"", {"X-Variant": "b"}))).body) == "b"
    assert json.loads((await switch(http_request(b"", {"X-Variant": "c"}))).body) == "a"


def test_results_that_are_not_json_give_a_500_naming_the_node() -> None:
    response = json_response("fan", {"v": {1, 2}})
    assert response.status_code == 500
    assert json.loads(response.body) == {
        "error": "node 'fan': result is not JSON-serializable: Object of type set is not JSON serializable"
    }
    assert json_response("fan", float("nan")).status_code == 500


def test_reconfigure_gives_a_running_router_the_new_graph_version() -> None:
    """The graph's identity arrives through user_config (a publish of a new version restarts no
    replica); a config without it, or from an older renderer, keeps what the router had."""
    from servegraph.dag.args import router_user_config
    from servegraph.dag.model import Graph, Telemetry
    from servegraph.runtime.telemetry import GraphContext

    router = SequenceRouter("seq", [], context=GraphContext("g", "1", Telemetry(metrics=False)))
    router.reconfigure(router_user_config(Graph(name="fraud", version="7", schema_version=1, applications=())))
    assert (router.context.graph, router.context.version, router.spans.graph) == ("fraud", "7", "fraud")
    router.reconfigure({"threshold": 1})
    assert (router.context.graph, router.context.version) == ("fraud", "7")
