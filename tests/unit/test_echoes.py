"""The operator's own writes coming back on the watch are dropped as they are decoded, and only
while no earlier event of the same object waits for its handler; everything else reaches kopf."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from servegraph.operator.cache import WatchCache
from servegraph.operator.kuberay import Live
from servegraph.operator.run import kopf_private, kopf_settings
from servegraph.operator.run.echoes import RAYSERVICE, SERVEGRAPH, EchoFilter

NS, NAME = "tenant", "g"


def servegraph(version: str, status: dict[str, Any] | None = None, **labels: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "servegraph.io/v1alpha1",
        "kind": "ServeGraph",
        "metadata": {"name": NAME, "namespace": NS, "uid": "u-1", "resourceVersion": version, "labels": labels},
        "spec": {"source": {"url": "https://r/g"}},
    }
    if status is not None:
        body["status"] = status
    return body


def rayservice(version: str, api_version: str = "ray.io/v1") -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "RayService",
        "metadata": {"name": NAME, "namespace": NS, "resourceVersion": version},
        "spec": {},
    }


def line(kind: str, obj: dict[str, Any]) -> str:
    return json.dumps({"type": kind, "object": obj})


@pytest.fixture
def decoding() -> Iterator[tuple[WatchCache, EchoFilter, Any]]:
    """A cache, its filter installed in the watch decoder, and the decoder kopf calls."""
    assert kopf_settings.decode_watch_events_with_orjson()
    cache = WatchCache()
    echoes = EchoFilter(cache)
    kopf_settings.drop_echoes(echoes.drop)
    try:
        yield cache, echoes, kopf_private.watch_loads()
    finally:
        kopf_settings.drop_echoes(None)


def test_an_applys_answer_reaches_kopf_as_a_bookmark_of_its_version(decoding: Any) -> None:
    cache, echoes, loads = decoding
    cache.put_applied((NS, NAME), Live(None, {}, resource_version="6"))
    assert loads(line("ADDED", rayservice("6"))) == {
        "type": "BOOKMARK",
        "object": {"metadata": {"resourceVersion": "6"}},
    }
    assert echoes.waiting() == 0 and echoes.dropped[RAYSERVICE] == 1
    # KubeRay's write after it is someone else's: passed on, and counted until its handler has it.
    event = loads(line("MODIFIED", rayservice("7")))
    assert event["type"] == "MODIFIED" and event["object"]["metadata"]["resourceVersion"] == "7"
    assert echoes.waiting() == 1
    echoes.handled(RAYSERVICE, event["object"])
    assert echoes.waiting() == 0


def test_a_status_writes_answer_is_dropped_and_anyone_elses_change_is_not(decoding: Any) -> None:
    cache, echoes, loads = decoding
    cache.put_servegraph(servegraph("4"))
    cache.put_status((NS, NAME), "u-1", {"phase": "x"}, servegraph("5", {"phase": "x"}))
    assert loads(line("MODIFIED", servegraph("5", {"phase": "x"})))["type"] == "BOOKMARK"
    assert echoes.dropped[SERVEGRAPH] == 1
    # The user's edit afterwards, and a later write whose answer changed more than the status.
    assert loads(line("MODIFIED", servegraph("6", {"phase": "x"}, team="a")))["type"] == "MODIFIED"
    cache.put_status((NS, NAME), "u-1", {"phase": "y"}, servegraph("7", {"phase": "y"}, team="b"))
    assert loads(line("MODIFIED", servegraph("7", {"phase": "y"}, team="b")))["type"] == "MODIFIED"
    assert echoes.dropped[SERVEGRAPH] == 1 and echoes.waiting() == 2


def test_an_echo_behind_a_waiting_event_of_its_object_goes_to_the_handler_in_order(decoding: Any) -> None:
    cache, echoes, loads = decoding
    earlier = loads(line("MODIFIED", rayservice("6")))  # KubeRay's, not yet handled
    cache.put_applied((NS, NAME), Live(None, {}, resource_version="7"))
    echo = loads(line("MODIFIED", rayservice("7")))
    assert (earlier["type"], echo["type"]) == ("MODIFIED", "MODIFIED")
    assert echoes.waiting() == 2 and echoes.dropped[RAYSERVICE] == 0
    echoes.handled(RAYSERVICE, earlier["object"])
    echoes.handled(RAYSERVICE, echo["object"])
    assert cache.echo_rayservice((NS, NAME), "7"), "the handler still knows it for its own apply"


def test_deletions_other_kinds_and_other_groups_are_never_dropped(decoding: Any) -> None:
    cache, echoes, loads = decoding
    cache.put_applied((NS, NAME), Live(None, {}, resource_version="6"))
    assert loads(line("DELETED", rayservice("6")))["type"] == "DELETED"
    cache.put_applied((NS, NAME), Live(None, {}, resource_version="8"))
    assert loads(line("MODIFIED", rayservice("8", api_version="ray.io/v1alpha1")))["type"] == "MODIFIED"
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": NAME, "namespace": NS}}
    assert loads(line("MODIFIED", secret))["type"] == "MODIFIED"
    assert loads(json.dumps({"type": "ERROR", "object": {"code": 410}}))["type"] == "ERROR"
    assert echoes.waiting() == 1, "the deletion waits for its handler; the rest are not counted"
    assert sum(echoes.dropped.values()) == 0


def test_an_object_listed_at_start_is_handled_without_having_been_counted() -> None:
    echoes = EchoFilter(WatchCache())
    echoes.handled(SERVEGRAPH, servegraph("1"))
    assert echoes.waiting() == 0


def test_without_a_filter_every_event_is_decoded_as_sent() -> None:
    assert kopf_settings.decode_watch_events_with_orjson()
    kopf_settings.drop_echoes(None)
    assert kopf_private.watch_loads()(line("ADDED", rayservice("6")))["object"]["metadata"]["resourceVersion"] == "6"


def test_the_drops_are_counted_by_kind_in_the_metrics() -> None:
    cache = WatchCache()
    echoes = EchoFilter(cache)
    registry = CollectorRegistry()
    registry.register(echoes)
    cache.put_applied((NS, NAME), Live(None, {}, resource_version="6"))
    assert echoes.drop({"type": "ADDED", "object": rayservice("6")})
    text = generate_latest(registry).decode()
    assert 'servegraph_watch_echoes_dropped_total{kind="rayservice"} 1.0' in text
    assert 'servegraph_watch_echoes_dropped_total{kind="servegraph"} 0.0' in text
