"""NoDiffBase is safe only with on.event handlers: the operator refuses to start with any other kind."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from servegraph.operator.run.kopf_settings import refuse_change_handlers


def test_the_operators_own_handlers_pass() -> None:
    import servegraph.operator.run.handlers  # noqa: F401 - registers them in the default registry

    registry = kopf.get_default_registry()
    assert registry._watching.get_all_handlers(), "the operator's on.event handlers are registered"
    refuse_change_handlers(registry)


@pytest.mark.parametrize("decorator", [kopf.on.create, kopf.on.update, kopf.on.resume, kopf.on.delete])
def test_a_change_handler_stops_the_start(decorator: Any) -> None:
    registry = kopf.OperatorRegistry()

    @kopf.on.event("servegraph.io", "v1alpha1", "servegraphs", registry=registry)
    async def watched(**_: Any) -> None: ...

    refuse_change_handlers(registry)  # on.event alone is fine

    @decorator("servegraph.io", "v1alpha1", "servegraphs", registry=registry)
    async def changed(**_: Any) -> None: ...

    with pytest.raises(RuntimeError, match=r"kopf change handlers registered \(\S*changed\).*NoDiffBase"):
        refuse_change_handlers(registry)


def test_a_field_handler_stops_the_start_too() -> None:
    registry = kopf.OperatorRegistry()

    @kopf.on.field("servegraph.io", "v1alpha1", "servegraphs", field="spec.source", registry=registry)
    async def source_changed(**_: Any) -> None: ...

    with pytest.raises(RuntimeError, match="source_changed"):
        refuse_change_handlers(registry)


def test_kopf_decodes_watch_events_with_orjson_and_the_same_result() -> None:
    import inspect
    import json

    from kopf._cogs.clients import api

    from servegraph.operator.run.kopf_settings import decode_watch_events_with_orjson

    assert decode_watch_events_with_orjson()
    assert decode_watch_events_with_orjson(), "a second start (tests, a restarted loop) keeps it"
    assert "json.loads(" in inspect.getsource(api.stream), "kopf still decodes each watch line by that name"
    event = {
        "type": "MODIFIED",
        "object": {
            "metadata": {"name": "g", "generation": 9223372036854775807, "uid": "ü-1"},
            "spec": {
                "serveConfigV2": "applications:\n- name: a\n",
                "weights": [0.25, -1e-300, 0, -9223372036854775808],
            },
        },
    }
    line = json.dumps(event, ensure_ascii=False)
    decoded = api.json.loads(line)
    assert decoded == json.loads(line)
    assert type(decoded["object"]["metadata"]["generation"]) is int
    with pytest.raises(json.JSONDecodeError, match="Expecting"):  # the standard library's words
        api.json.loads('{"type": "ADDED", "object": {')
