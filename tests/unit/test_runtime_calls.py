"""What routers do on every call, with in-process handles: timeouts, retries, optional
ensemble members, the 504 naming the node, and the headers each kind of child receives.
(The same on a real Ray, with its metrics endpoint, is tests/e2e/test_e2e_observability.py.)"""

from __future__ import annotations

import asyncio
import json
import pickle
import time
from collections.abc import Callable
from typing import Any

import pytest
from starlette.requests import Request

from servegraph.dag.model import Call, Telemetry
from servegraph.runtime.builder import takes_headers
from servegraph.runtime.calls import NodeTimeout, timeout_of
from servegraph.runtime.routers import (
    Child,
    EnsembleRouter,
    GraphContext,
    Router,
    SequenceRouter,
    SwitchRouter,
)

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Handle:
    """Stands in for a DeploymentHandle: `.remote()` runs the target as a task; `.cancel()` cancels it."""

    def __init__(self, target: Any, method: str = "__call__") -> None:
        self.target, self.method = target, method
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.cancelled = 0

    def options(self, *, method_name: str) -> Handle:
        other = Handle(self.target, method_name)
        other.calls = self.calls
        return other

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        fn = self.target if self.method == "__call__" else getattr(self.target, self.method)

        async def run() -> Any:
            result = fn(*args, **kwargs)
            return await result if asyncio.iscoroutine(result) else result

        task = asyncio.ensure_future(run())
        outer = self

        class Response:
            def __await__(self) -> Any:
                return task.__await__()

            def cancel(self) -> None:
                outer.cancelled += 1
                task.cancel()

        return Response()


PLAIN = Call()


def user(node_id: str, fn: Callable[..., Any], call: Call = PLAIN, headers: bool = False) -> Child:
    return Child(node_id, Handle(fn), router=False, call=call, takes_headers=headers)


def router(node_id: str, target: Router, call: Call = PLAIN) -> Child:
    return Child(node_id, Handle(target), router=True, call=call)


def sleeper(seconds: float, answer: Any = "late") -> Callable[[Any], Any]:
    async def run(_: Any) -> Any:
        await asyncio.sleep(seconds)
        return answer

    return run


def http_request(body: bytes, headers: dict[str, str]) -> Request:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw, "query_string": b""}, receive)


async def test_a_timeout_cuts_the_call_cancels_it_and_names_the_node() -> None:
    slow = user("slow", sleeper(5), Call(timeout_s=0.05))
    seq = SequenceRouter("seq", [slow])
    started = time.monotonic()
    with pytest.raises(NodeTimeout) as raised:
        await seq.route("x", {})
    assert time.monotonic() - started < 1
    assert (raised.value.node, raised.value.attempts, str(raised.value)) == (
        "slow",
        1,
        'node "slow" timed out after 0.05 s',
    )
    assert slow.handle.cancelled == 1


async def test_retries_try_again_after_a_timeout_or_an_error() -> None:
    attempts: list[float] = []

    async def flaky(payload: Any) -> Any:
        attempts.append(time.monotonic())
        if len(attempts) == 1:
            await asyncio.sleep(5)  # cut by the timeout
        if len(attempts) == 2:
            raise ValueError("transient")
        return payload + "!"

    seq = SequenceRouter("seq", [user("flaky", flaky, Call(timeout_s=0.05, retries=2))])
    assert await seq.route("ok", {}) == "ok!"
    assert len(attempts) == 3

    always = user("down", sleeper(5), Call(timeout_s=0.02, retries=2))
    with pytest.raises(NodeTimeout, match=r'node "down" timed out after 0.02 s on each of 3 attempts'):
        await SequenceRouter("seq", [always]).route("x", {})
    assert len(always.handle.calls) == 3


async def test_an_error_after_the_last_retry_propagates_as_it_was() -> None:
    def broken(_: Any) -> Any:
        raise KeyError("missing")

    child = user("broken", broken, Call(retries=1))
    with pytest.raises(KeyError):
        await SequenceRouter("seq", [child]).route("x", {})
    assert len(child.handle.calls) == 2


async def test_a_childs_own_timeout_error_is_not_the_edges_timeout() -> None:
    def gives_up(_: Any) -> Any:
        raise TimeoutError("the model's own client timed out")

    with pytest.raises(TimeoutError, match="own client"):
        await SequenceRouter("seq", [user("m", gives_up, Call(timeout_s=5))]).route("x", {})


async def test_a_required_member_timing_out_fails_the_ensemble_and_cancels_the_others() -> None:
    other_cancelled = asyncio.Event()

    async def patient(_: Any) -> Any:
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            other_cancelled.set()
            raise

    ensemble = EnsembleRouter("ens", [user("patient", patient), user("slow", sleeper(5), Call(timeout_s=0.05))])
    with pytest.raises(NodeTimeout) as raised:
        await ensemble.route("x", {})
    assert raised.value.node == "slow"
    await asyncio.wait_for(other_cancelled.wait(), 1)


async def test_an_optional_member_is_cut_and_its_entry_says_why() -> None:
    def boom(_: Any) -> Any:
        raise ValueError("bad input")

    ensemble = EnsembleRouter(
        "ens",
        [
            user("fast", lambda p: p.upper()),
            user("slow", sleeper(5), Call(timeout_s=0.05, optional=True)),
            user("broken", boom, Call(optional=True)),
        ],
    )
    started = time.monotonic()
    result = await ensemble.route("x", {})
    assert time.monotonic() - started < 1
    assert result == {
        "fast": "X",
        "slow": {"error": 'node "slow" timed out after 0.05 s', "node": "slow", "timed_out": True},
        "broken": {"error": 'node "broken" failed: ValueError', "node": "broken"},
    }


async def test_the_ingress_answers_504_naming_the_node_that_timed_out_below_it() -> None:
    inner = EnsembleRouter("ens", [user("fast", lambda p: p), user("slow", sleeper(5), Call(timeout_s=0.05))])
    top = SequenceRouter("top", [router("ens", inner)])
    response = await top(http_request(b'"x"', {}))
    assert response.status_code == 504
    assert json.loads(bytes(response.body)) == {
        "error": 'node "slow" timed out after 0.05 s',
        "node": "slow",
        "timed_out": True,
    }


def test_node_timeout_survives_pickling_and_ray_style_wrapping() -> None:
    """Ray pickles an exception from one replica to the next and wraps it (RayTaskError.cause)."""
    again = pickle.loads(pickle.dumps(NodeTimeout("slow", 0.5, 2)))
    assert (again.node, again.timeout_s, again.attempts) == ("slow", 0.5, 2)

    class Wrapped(Exception):
        cause = again

    found = timeout_of(Wrapped())
    assert found is not None and found.body()["node"] == "slow"
    assert timeout_of(ValueError()) is None


async def test_user_code_gets_the_trace_context_and_the_configured_headers_only_if_it_asks() -> None:
    seen: dict[str, Any] = {}

    def asks(payload: Any, headers: dict[str, str] | None = None) -> Any:
        seen["asks"] = headers
        return payload

    def plain(payload: Any) -> Any:
        seen["plain"] = payload
        return payload

    context = GraphContext("g", "7", Telemetry(forward_headers=("x-request-id",)))
    switch = SwitchRouter("sw", [], user("asks", asks, headers=True), header="x-kind", context=context)
    top = SequenceRouter("top", [user("plain", plain), router("sw", switch)], context=context)
    headers = {
        "traceparent": TRACEPARENT,
        "tracestate": "vendor=1",
        "x-request-id": "r-1",
        "x-kind": "a",
        "authorization": "Bearer secret",
    }
    response = await top(http_request(b'"p"', headers))
    assert response.status_code == 200
    assert seen["plain"] == "p"
    # The switch below saw every header (it routes on x-kind); user code only what is forwarded.
    assert seen["asks"] == {"traceparent": TRACEPARENT, "tracestate": "vendor=1", "x-request-id": "r-1"}


class WithHeaders:
    def __call__(self, payload: Any, headers: Any = None) -> Any:
        return payload


class KeywordOnly:
    async def __call__(self, payload: Any, *, headers: Any) -> Any:
        return payload


class Plain:
    def __call__(self, payload: Any) -> Any:
        return payload


class AnyKeywords:
    def __call__(self, payload: Any, **kwargs: Any) -> Any:
        return payload


def function_with_headers(payload: Any, headers: Any = None) -> Any:
    return payload


@pytest.mark.parametrize(
    ("target", "expected"),
    [(WithHeaders, True), (KeywordOnly, True), (function_with_headers, True), (Plain, False), (AnyKeywords, False)],
)
def test_only_a_declared_headers_keyword_asks_for_headers(target: Any, expected: bool) -> None:
    assert takes_headers(target) is expected
