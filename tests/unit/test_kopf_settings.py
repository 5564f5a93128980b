"""NoDiffBase is safe only with on.event handlers: the operator refuses to start with any other kind."""

from __future__ import annotations

from typing import Any

import kopf
import pytest

from servegraph.operator.run import kopf_private
from servegraph.operator.run.kopf_settings import refuse_change_handlers


def test_the_operators_own_handlers_pass() -> None:
    import servegraph.operator.run.handlers  # noqa: F401 - registers them in the default registry

    registry = kopf.get_default_registry()
    assert kopf_private.watching_handlers(registry), "the operator's on.event handlers are registered"
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
    import json

    from servegraph.operator.run.kopf_settings import decode_watch_events_with_orjson

    assert decode_watch_events_with_orjson()
    assert decode_watch_events_with_orjson(), "a second start (tests, a restarted loop) keeps it"
    kopf_private.check()  # kopf still decodes each watch line with that name
    loads = kopf_private.watch_loads()
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
    decoded = loads(line)
    assert decoded == json.loads(line)
    assert type(decoded["object"]["metadata"]["generation"]) is int
    with pytest.raises(json.JSONDecodeError, match="Expecting"):  # the standard library's words
        loads('{"type": "ADDED", "object": {')


def test_watch_events_lose_their_field_sets_but_keep_who_wrote_them() -> None:
    """kopf holds each object's last event for seconds; its field sets were near half the dicts the
    garbage collector walked. The managers stay: a conflict's message names them."""
    import json

    from servegraph.operator.apply.drift import live_of
    from servegraph.operator.run.kopf_settings import decode_watch_events_with_orjson

    assert decode_watch_events_with_orjson()
    loads = kopf_private.watch_loads()
    fields = {"f:spec": {"f:rayClusterConfig": {".": {}, "f:headGroupSpec": {}}}}
    entries = [
        {"manager": "a-person", "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": fields},
        {"manager": "kuberay-operator", "operation": "Update", "subresource": "status", "fieldsV1": fields},
    ]
    event = {
        "type": "ADDED",
        "object": {
            "apiVersion": "ray.io/v1",
            "kind": "RayService",
            "metadata": {"name": "g", "namespace": "t", "resourceVersion": "7", "managedFields": entries},
            "spec": {"serveConfigV2": "applications: []\n"},
        },
    }
    decoded = loads(json.dumps(event))
    kept = decoded["object"]["metadata"]["managedFields"]
    assert kept == [{k: v for k, v in e.items() if k != "fieldsV1"} for e in entries]
    assert decoded["object"]["spec"] == event["object"]["spec"], "only the field sets go"
    assert live_of(decoded["object"], None).managers == ("a-person",), "KubeRay's status writes name no writer"
    # A line orjson refuses (a number past a double's range) goes to the standard library: stripped alike.
    refused = loads(json.dumps(event).replace('"applications: []\\n"', "1e400"))
    assert refused["object"]["spec"]["serveConfigV2"] == float("inf"), "decoded by the standard library"
    assert refused["object"]["metadata"]["managedFields"] == kept
    # Events of other shapes pass as they came: a watch's ERROR carries a Status, a BOOKMARK no fields.
    for other in ({"type": "ERROR", "object": {"kind": "Status", "code": 410}}, {"type": "BOOKMARK"}, [1, 2]):
        assert loads(json.dumps(other)) == other
