"""A switch or splitter below another router is decided by that router (runtime/choice.py):
the grandchild is called directly, the switch's replica never, and both edges keep their
timeouts, retries and metrics. In-process handles; on a real Ray the e2e streaming and
serving tests run graphs whose switches sit below sequences."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_runtime_streams import Flaky, Gen, Handle, body_of, closed, collect, request

from servegraph.dag.model import Call
from servegraph.runtime.calls import Child, NodeTimeout
from servegraph.runtime.choice import SplitChoice, SwitchChoice
from servegraph.runtime.routers import SequenceRouter


class Unreachable:
    """The switch's own replica: the router above it must not call it."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the switch's replica was called")

    route = stream = __call__


def gen_child(node_id: str, gen: Any, call: Call | None = None) -> Child:
    return Child(node_id, Handle(gen), False, call or Call(), False, True)


def switch(children: dict[str, Child], default: Child, streams: bool, call: Call | None = None) -> Child:
    choice = SwitchChoice.of(list(children.items()), default, None, "x-model")
    return Child("sw", Handle(Unreachable()), True, call or Call(), False, streams, choice)


class Recorder:
    """EdgeMetrics' interface, remembering (caller, node) of every recorded call and stream."""

    def __init__(self) -> None:
        self.edges: list[tuple[str, str, str]] = []

    def call(self, caller: str, node: str, seconds: float) -> None:
        self.edges.append(("call", caller, node))

    def first_item(self, caller: str, node: str, seconds: float) -> None:
        pass

    def streamed(self, caller: str, node: str, count: int, seconds: float) -> None:
        self.edges.append(("stream", caller, node))

    def failed(self, caller: str, node: str, kind: str) -> None:
        self.edges.append((f"failed:{kind}", caller, node))

    def retried(self, caller: str, node: str, reason: str) -> None:
        self.edges.append((f"retried:{reason}", caller, node))


def recorded(router: Any) -> Recorder:
    recorder = Recorder()
    router.metrics = recorder
    return recorder


async def test_a_stream_through_a_switch_comes_from_the_chosen_generator_directly() -> None:
    a, b = Gen(count=1), Gen(count=3)
    seq = SequenceRouter("seq", [switch({"b": gen_child("gen-b", b)}, gen_child("gen-a", a), True)], streams=True)
    metrics = recorded(seq)
    assert [x["i"] for x in await collect(seq, "p", {"x-model": "b"})] == [0, 1, 2]
    assert (a.produced, b.produced) == (0, 3)
    # Both edges recorded, each under its own names, as when the switch had its own replica.
    assert metrics.edges == [("stream", "sw", "gen-b"), ("stream", "seq", "sw")]
    assert len(await collect(seq, "p", {})) == 1


async def test_a_unary_call_through_a_switch_and_a_splitter_reaches_the_grandchild() -> None:
    def user(node_id: str, fn: Any) -> Child:
        return Child(node_id, Handle(fn), False)

    canary = SplitChoice((user("v1", lambda p: {"v1": p}), user("v2", lambda p: {"v2": p})), (100, 0))
    split = Child("split", Handle(Unreachable()), True, Call(), False, False, canary)
    sw = Child("sw", Handle(Unreachable()), True, Call(), False, False, SwitchChoice.of([], split, "k", None))
    seq = SequenceRouter("seq", [sw])
    metrics = recorded(seq)
    assert await seq.route({"k": "x"}, {}) == {"v1": {"k": "x"}}
    assert metrics.edges == [("call", "split", "v1"), ("call", "sw", "split"), ("call", "seq", "sw")]


async def test_the_edge_into_the_switch_still_bounds_the_first_item() -> None:
    slow = Gen(first_delay=1.0)
    grandchild = gen_child("gen", slow)
    seq = SequenceRouter("seq", [switch({}, grandchild, True, Call(timeout_s=0.1))], streams=True)
    response = await seq(request())
    assert response.status_code == 504
    assert json.loads(response.body) == {"error": 'node "sw" timed out after 0.1 s', "node": "sw", "timed_out": True}
    await closed(grandchild)
    assert slow.closed == 1  # the grandchild's generator was closed with the cut edge


async def test_the_edge_below_the_switch_keeps_its_retries() -> None:
    flaky = Flaky(count=2)
    seq = SequenceRouter("seq", [switch({}, gen_child("gen", flaky, Call(retries=1)), True)], streams=True)
    metrics = recorded(seq)
    assert [x["i"] for x in await collect(seq)] == [0, 1]
    assert flaky.calls == 2
    assert ("retried:error", "sw", "gen") in metrics.edges


async def test_a_client_that_leaves_closes_the_grandchild_through_the_choice() -> None:
    gen = Gen(count=100, pause=0.01)
    grandchild = gen_child("gen", gen)
    seq = SequenceRouter("seq", [switch({}, grandchild, True)], streams=True)
    body = (await seq(request())).body_iterator
    assert json.loads(await anext(body)) == {"i": 0, "for": "p"}
    await body.aclose()
    await closed(grandchild)
    assert gen.closed == 1 and gen.produced < 5


async def test_a_failure_below_the_switch_names_the_node_that_failed() -> None:
    broken = Gen(count=3, fail_at=1)
    seq = SequenceRouter("seq", [switch({}, gen_child("gen", broken), True)], streams=True)
    lines = [json.loads(x) for x in await body_of(await seq(request()))]
    assert lines[-1] == {"error": 'node "gen" failed: ValueError', "node": "gen", "timed_out": False}


async def test_the_last_try_of_a_timed_out_edge_below_the_switch_names_that_edge() -> None:
    slow = Gen(first_delay=1.0)
    seq = SequenceRouter("seq", [switch({}, gen_child("gen", slow, Call(timeout_s=0.05)), True)], streams=True)
    with pytest.raises(NodeTimeout) as err:
        await collect(seq)
    assert err.value.node == "gen"
