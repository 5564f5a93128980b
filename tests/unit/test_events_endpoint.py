"""The events endpoint acknowledges (202) only what it did: a ServeGraph it could not annotate,
or a token Secret it could not read, is answered 503 with Retry-After, so the sender sends the
event again (issue 44, item 2). In-memory stand-ins for the API server; the real one is in
tests/integration/test_events_outage.py."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web
from cloudevents.core.bindings.http import to_binary_event
from cloudevents.core.v1.event import CloudEvent

from servegraph.kube import KubeClient, KubeError
from servegraph.names import REFRESH_ANNOTATION
from servegraph.operator.metrics import Metrics
from servegraph.operator.run.app import EventsToken
from servegraph.operator.run.events_endpoint import ANNOTATE_AT_ONCE, RETRY_AFTER_S, Unavailable, events_app
from servegraph.operator.secrets import SecretKeyRef

TOKEN = "the-events-token"
URL = "https://registry.example/v1/graphs/g"


def _sg(namespace: str, name: str) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name}, "spec": {"source": {"url": URL}}}


@dataclass
class Api:
    """The API server as the endpoint sees it: annotations written, or the error each raises."""

    annotations: dict[str, str] = field(default_factory=dict)
    fail: dict[str, KubeError] = field(default_factory=dict)
    """ServeGraph ("ns/name", or "*" for all) → the error its annotate raises."""
    calls: int = 0

    async def annotate(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        self.calls += 1
        await asyncio.sleep(0)
        error = self.fail.get(f"{namespace}/{name}") or self.fail.get("*")
        if error is not None:
            raise error
        self.annotations[f"{namespace}/{name}"] = annotations[REFRESH_ANNOTATION]


@dataclass
class Endpoint:
    url: str
    api: Api
    token: dict[str, str | None]
    """{"value": the token, or None: the Secret cannot be read}"""
    metrics: Metrics = field(default_factory=Metrics)
    synced: dict[str, bool] = field(default_factory=lambda: {"value": True})

    async def post(self, event_id: str, token: str | None = TOKEN) -> tuple[int, dict[str, str], Any]:
        event = CloudEvent(
            attributes={"type": "io.servegraph.graph.published", "source": "https://r", "id": event_id, "subject": URL}
        )
        message = to_binary_event(event)
        headers = dict(message.headers)
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        async with aiohttp.ClientSession() as session, session.post(self.url, headers=headers, data=message.body) as r:
            return r.status, dict(r.headers), await r.json()


@pytest.fixture
async def endpoint() -> AsyncIterator[Endpoint]:
    api = Api()
    state: dict[str, str | None] = {"value": TOKEN}
    servegraphs = [_sg("a", "one"), _sg("a", "two"), _sg("b", "three")]

    async def token(_: bool) -> str:
        value = state["value"]
        if value is None:
            raise Unavailable("the Secret cannot be read")
        return value

    metrics = Metrics()
    synced = {"value": True}
    app = events_app(
        token,
        lambda url: servegraphs if url == URL else [],
        api.annotate,
        answered=lambda status: metrics.events.labels(str(status)).inc(),
        synced=lambda: synced["value"],
    )
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield Endpoint(f"http://127.0.0.1:{runner.addresses[0][1]}/v1/events", api, state, metrics, synced)
    finally:
        await runner.cleanup()


async def test_an_event_not_every_servegraph_took_is_answered_503_and_taken_when_sent_again(
    endpoint: Endpoint,
) -> None:
    endpoint.api.fail["a/two"] = KubeError("Timeout", "annotate ServeGraph a/two: no answer from the API server")
    status, headers, body = await endpoint.post("e1")
    assert status == 503, body
    assert headers["Retry-After"] == str(RETRY_AFTER_S)
    assert body["failed"] == ["a/two"] and "could not be refreshed" in body["error"]
    assert body["refreshed"] == ["a/one", "b/three"], "what was annotated is said, and kept"

    endpoint.api.fail.clear()  # the API server is back: the sender's retry is acknowledged
    status, _, body = await endpoint.post("e1")
    assert (status, body) == (202, {"refreshed": ["a/one", "a/two", "b/three"]})
    assert endpoint.api.annotations == {"a/one": "e1", "a/two": "e1", "b/three": "e1"}
    exposition = endpoint.metrics.exposition().decode()
    assert 'servegraph_events_total{code="503"} 1.0' in exposition, "a deferred event shows in the metrics"
    assert 'servegraph_events_total{code="202"} 1.0' in exposition


async def test_an_event_before_the_servegraphs_are_listed_is_answered_503_not_acknowledged_for_none(
    endpoint: Endpoint,
) -> None:
    endpoint.synced["value"] = False  # a replica starting: its watches have not listed yet
    status, headers, body = await endpoint.post("e0")
    assert (status, headers["Retry-After"]) == (503, str(RETRY_AFTER_S)), body
    assert "not listed its ServeGraphs yet" in body["error"]
    assert endpoint.api.calls == 0
    endpoint.synced["value"] = True
    status, _, body = await endpoint.post("e0")
    assert (status, body) == (202, {"refreshed": ["a/one", "a/two", "b/three"]})


async def test_a_servegraph_deleted_since_it_was_watched_needs_nothing(endpoint: Endpoint) -> None:
    endpoint.api.fail["a/one"] = KubeError("NotFound", "annotate ServeGraph a/one: not found", 404)
    status, _, body = await endpoint.post("e2")
    assert (status, body) == (202, {"refreshed": ["a/two", "b/three"]})


async def test_a_refused_annotation_is_not_acknowledged_either(endpoint: Endpoint) -> None:
    endpoint.api.fail["b/three"] = KubeError("Forbidden", "annotate ServeGraph b/three: forbidden", 403)
    status, _, body = await endpoint.post("e3")
    assert status == 503 and body["failed"] == ["b/three"] and body["refreshed"] == ["a/one", "a/two"]


async def test_once_the_api_server_is_seen_down_the_rest_are_not_tried() -> None:
    """A selector matching many ServeGraphs during an outage is answered within about one API
    timeout, not one per ServeGraph."""
    from servegraph.operator.run.events_endpoint import refresh

    api = Api(fail={"*": KubeError("Unavailable", "annotate: ServerDisconnectedError talking to the API server")})
    many = [_sg("ns", f"sg-{i:03d}") for i in range(200)]
    result = await refresh(many, "e4", api.annotate)
    assert result.done == [] and len(result.failed) == 200
    assert api.calls <= ANNOTATE_AT_ONCE


async def test_an_unreadable_token_is_503_never_401_and_no_failed_authentication(endpoint: Endpoint) -> None:
    endpoint.token["value"] = None
    answers = [await endpoint.post(f"u{i}") for i in range(8)]
    assert {a[0] for a in answers} == {503}, "the right token is never refused, and never rate-limited as a guess"
    assert all(a[1]["Retry-After"] == str(RETRY_AFTER_S) for a in answers)
    assert endpoint.api.calls == 0
    assert (await endpoint.post("u9", token=None))[0] == 401, "no token at all is still 401"

    endpoint.token["value"] = TOKEN
    assert (await endpoint.post("u10"))[0] == 202


async def test_a_guess_while_the_token_cannot_be_read_again_counts_as_a_failure() -> None:
    """A token that does not match the copy held, when the Secret cannot be read again to look
    for a rotation, is answered 503 but counted: an outage is no time for free guesses."""
    reads: list[bool] = []

    async def token(mismatch: bool) -> str:
        reads.append(mismatch)
        if mismatch:
            raise Unavailable("cannot read")
        return TOKEN

    app = events_app(token, lambda _: [], Api().annotate)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/events"
    try:
        endpoint = Endpoint(url, Api(), {})
        statuses = [(await endpoint.post(f"g{i}", token="guess"))[0] for i in range(7)]
    finally:
        await runner.cleanup()
    assert statuses[:5] == [503] * 5 and statuses[5:] == [429, 429]


class _Secrets:
    """`KubeClient.read_secret_data` as the API server answers it: data, or an error."""

    def __init__(self) -> None:
        self.answer: dict[str, str] | KubeError = {"token": base64.b64encode(TOKEN.encode()).decode()}
        self.reads = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def read_secret_data(self, namespace: str, name: str) -> dict[str, str]:
        self.reads += 1
        await self.gate.wait()
        if isinstance(self.answer, KubeError):
            raise self.answer
        return self.answer


def _token(api: _Secrets) -> EventsToken:
    return EventsToken(kube=cast(KubeClient, api), ref=SecretKeyRef("ops", "events", "token"))


@pytest.mark.parametrize(
    "answer",
    [
        KubeError("Timeout", "read Secret ops/events: no answer from the API server in time"),
        KubeError("NotFound", "read Secret ops/events: not found", 404),
        {"other": "eA=="},
        {"token": base64.b64encode(b"  \n").decode()},
    ],
    ids=["api-down", "no-secret", "no-key", "empty"],
)
async def test_the_token_unreadable_is_unavailable_not_a_missing_token(answer: Any) -> None:
    api = _Secrets()
    api.answer = answer
    token = _token(api)
    with pytest.raises(Unavailable, match="ops/events cannot be read"):
        await token.get()
    with pytest.raises(Unavailable):
        await token.get()
    assert api.reads == 1, "a failed read is tried again at most once a second, not per request"


async def test_requests_share_one_read_and_a_good_read_ends_the_outage() -> None:
    api = _Secrets()
    api.gate.clear()
    token = _token(api)
    waiting = [asyncio.create_task(token.get()) for _ in range(20)]
    await asyncio.sleep(0.01)
    api.gate.set()
    assert await asyncio.gather(*waiting) == [TOKEN] * 20
    assert api.reads == 1

    api.answer = KubeError("Unavailable", "read Secret ops/events: ServerDisconnectedError")
    token.read_at = -1e9  # its copy expired
    with pytest.raises(Unavailable):
        await token.get()
    assert token.value is None, "an expired copy is not used while the Secret cannot be read"
    api.answer = {"token": base64.b64encode(TOKEN.encode()).decode()}
    token.read_at = -1e9
    assert await token.get() == TOKEN
