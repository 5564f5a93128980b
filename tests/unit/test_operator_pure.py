"""The operator's pure parts, without a server: spec reading, conditions, status
mirroring, merge patches, drift comparison, the work queue, event parsing."""

from __future__ import annotations

import asyncio
import base64

import pytest
from cloudevents.core.bindings.http import to_binary_event, to_structured_event
from cloudevents.core.v1.event import CloudEvent
from support import SAMPLES

from servegraph.graph import load_graph
from servegraph.names import ConditionType
from servegraph.operator import conditions, secrets
from servegraph.operator.apply.drift import contains
from servegraph.operator.conditions import Condition
from servegraph.operator.kuberay import mirror_applications, mirror_upgrade
from servegraph.operator.queue import WorkQueue
from servegraph.operator.run.events_endpoint import TokenBucket, matches, parse_event, parse_selector
from servegraph.operator.secrets import SecretError, SecretKeyRef
from servegraph.operator.spec import ConfigMapKeyRef, SpecError, parse_duration, parse_spec
from servegraph.operator.status.report import fold_events, merge_patch, ready_condition
from servegraph.operator.values import Event


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30), ("5m", 300), ("1h30m", 5400), ("1.5s", 1.5), ("250ms", 0.25)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "x") == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "m5", "5 m", "1h-2m", "5d"])
def test_bad_durations_name_the_field(text: str) -> None:
    with pytest.raises(SpecError, match=r"spec\.source\.timeout: .* is not a duration"):
        parse_duration(text, "source.timeout")


def test_spec_defaults_and_overrides() -> None:
    spec = parse_spec(
        {
            "source": {
                "url": "https://r/x",
                "tokenSecretRef": {"name": "t"},
                "caBundle": {"configMapRef": {"name": "ca"}},
            },
            "rayService": {"name": "svc", "image": "img:1", "workers": {"nodeSelector": {"pool": "ray"}}},
        },
        "team-a",
    )
    assert spec.source.token == SecretKeyRef("team-a", "t", "token")
    assert spec.source.timeout_s == 30 and spec.source.poll_interval_s is None
    assert spec.source.ca_config_map == ConfigMapKeyRef("team-a", "ca", "ca.crt")
    assert spec.source.ca_secret is None
    assert (spec.ray_service.name, spec.ray_service.image, spec.ray_service.strategy) == ("svc", "img:1", None)
    options = spec.rayservice_options("sg", "ns", {"uid": "u"})
    assert (options.name, options.image, options.labels) == ("svc", "img:1", {"servegraph.io/graph": "sg"})
    assert dict(options.workers.node_selector) == {"pool": "ray"}
    with pytest.raises(SpecError, match=r"url and tokenSecretRef\.name are required"):
        parse_spec({"source": {"url": "https://r/x"}}, "team-a")


def test_condition_transition_time_moves_only_on_status_change() -> None:
    first = conditions.merge([], [Condition(ConditionType.FETCHED, True, "Downloaded", "a")], 1, "T1")
    same = conditions.merge(first, [Condition(ConditionType.FETCHED, True, "NotModified", "b")], 2, "T2")
    flipped = conditions.merge(same, [Condition(ConditionType.FETCHED, False, "Timeout", "c")], 2, "T3")
    assert first[0]["lastTransitionTime"] == "T1"
    assert (
        same[0]["lastTransitionTime"] == "T1"
        and same[0]["reason"] == "NotModified"
        and same[0]["observedGeneration"] == 2
    )
    assert flipped[0]["lastTransitionTime"] == "T3" and flipped[0]["status"] == "False"
    ordered = conditions.merge(
        flipped,
        [Condition(ConditionType.READY, None, "X", ""), Condition(ConditionType.APPLIED, True, "Y", "")],
        2,
        "T4",
    )
    assert [c["type"] for c in ordered] == ["Fetched", "Applied", "Ready"]
    assert ordered[2]["status"] == "Unknown"


RAYSERVICE = {
    "status": {
        "activeServiceStatus": {
            "applicationStatuses": {
                "sentiment": {
                    "status": "DEPLOY_FAILED",
                    "message": "boom",
                    "serveDeploymentStatuses": {
                        "tokenizer": {"status": "HEALTHY"},
                        "sentiment": {"status": "UNHEALTHY", "message": "crash"},
                    },
                }
            }
        }
    }
}


def test_mirror_and_ready() -> None:
    graph = [a.name for a in load_graph(SAMPLES / "mini.pb").applications]
    apps = mirror_applications(RAYSERVICE)
    assert apps == {
        "sentiment": {
            "status": "DEPLOY_FAILED",
            "message": "boom",
            "deployments": {
                "sentiment": {"status": "UNHEALTHY", "message": "crash"},
                "tokenizer": {"status": "HEALTHY"},
            },
        }
    }
    # The first blocking problem leads (the unhealthy deployment's message: it names the node).
    assert ready_condition(graph, True, apps) == Condition(
        "Ready",
        False,
        "ApplicationsNotRunning",
        'application "sentiment": deployment "sentiment": crash; sentiment: DEPLOY_FAILED',
    )
    assert ready_condition(graph, True, {"sentiment": {"status": "RUNNING"}}).status is True
    assert ready_condition(graph, True, {}).reason == "WaitingForApplications"
    assert ready_condition(graph, False, {}).reason == "RayServiceMissing"
    assert ready_condition(None, False, {}).reason == "NoValidGraph"
    three_apps = [a.name for a in load_graph(SAMPLES / "complete.pb").applications]
    partial = ready_condition(three_apps, True, {"reviews": {"status": "RUNNING"}})
    assert partial.status is False and partial.message == "search: not reported; chat: not reported"


def test_merge_patch_is_minimal_and_deletes_removed_keys() -> None:
    old = {"a": 1, "apps": {"x": {"status": "RUNNING"}, "y": {"status": "RUNNING"}}, "list": [1, 2]}
    new = {"a": 1, "apps": {"x": {"status": "DEPLOYING"}}, "list": [1, 2], "b": 2}
    assert merge_patch(old, new) == {"apps": {"x": {"status": "DEPLOYING"}, "y": None}, "b": 2}
    assert merge_patch(new, new) == {}


def test_contains_ignores_server_defaults_but_not_edits() -> None:
    desired = {"spec": {"a": 1, "groups": [{"name": "cpu", "replicas": 2}]}}
    live = {"spec": {"a": 1, "defaulted": True, "groups": [{"name": "cpu", "replicas": 2, "extra": 0}]}, "status": {}}
    assert contains(live, desired)
    assert not contains({"spec": {"a": 2, "groups": [{"name": "cpu", "replicas": 2}]}}, desired)
    assert not contains({"spec": {"a": 1, "groups": []}}, desired)
    assert not contains({"spec": {"a": 1}}, desired)


def test_fold_events_keeps_one_normal_event() -> None:
    events = [
        Event("Normal", "Fetched", "graph g version '1'"),
        Event("Normal", "Applied", "created RayService g"),
        Event("Warning", "X", "y"),
    ]
    assert fold_events(events) == [
        Event("Normal", "Applied", "created RayService g: graph g version '1'"),
        Event("Warning", "X", "y"),
    ]
    assert fold_events([Event("Normal", "Fetched", "f")]) == [Event("Normal", "Fetched", "f")]


async def test_queue_dedupes_and_requeues_dirty_keys() -> None:
    q: WorkQueue[str] = WorkQueue(base_delay_s=0.01, max_delay_s=0.05)
    q.add("a")
    q.add("a")
    assert len(q) == 1
    key = await q.get()
    q.add("a")  # changed while being processed: runs once more after
    assert len(q) == 0
    q.done(key)
    assert len(q) == 1 and await q.get() == "a"
    q.done("a")
    delays = [q.retry("b") for _ in range(4)]
    assert delays[0] < delays[-1] <= 0.05 * 1.2
    await asyncio.wait_for(q.get(), timeout=5)


def test_token_bucket() -> None:
    now = [0.0]
    bucket = TokenBucket(rate=1, burst=2, clock=lambda: now[0])
    assert [bucket.take() for _ in range(3)] == [True, True, False]
    now[0] = 1.0
    assert bucket.take() and not bucket.take()


def _event(**attrs: object) -> CloudEvent:
    base: dict[str, object] = {"type": "io.servegraph.graph.published", "source": "https://r", "id": "1"}
    base.update(attrs)
    return CloudEvent(attributes=base, data=None)


def test_parse_event_both_modes_and_matching() -> None:
    for message in (to_binary_event(_event(subject="https://r/g")), to_structured_event(_event(subject="https://r/g"))):
        published = parse_event(message.headers, message.body)
        assert published.url == "https://r/g" and published.event_id == "1"
    sg = {"metadata": {"labels": {"team": "a"}}, "spec": {"source": {"url": "https://r/g"}}}
    assert matches(sg, parse_event(*_parts(to_binary_event(_event(subject="https://r/g")))))
    assert not matches(sg, parse_event(*_parts(to_binary_event(_event(subject="https://r/other")))))
    assert parse_selector("team=a, tier==gold,canary") == (("team", "a"), ("tier", "gold"), ("canary", None))
    with pytest.raises(ValueError, match="unsupported selector"):
        parse_selector("team!=a")
    with pytest.raises(ValueError, match="unsupported event type"):
        parse_event(*_parts(to_binary_event(_event(type="x.y", subject="s"))))
    with pytest.raises(ValueError, match="not a CloudEvent"):
        parse_event({"content-type": "application/json"}, b"[]")


def _parts(message: object) -> tuple[dict[str, str], bytes]:
    return dict(message.headers), message.body  # type: ignore[attr-defined]


def test_secret_references_from_a_flag_and_their_values() -> None:
    ref = secrets.from_flag("servegraph-system/events-token", key="token")
    assert ref == SecretKeyRef("servegraph-system", "events-token", "token")
    assert [secrets.from_flag(text, key="token") for text in ("events-token", "/x", "ns/")] == [None, None, None]
    assert secrets.value(ref, {"token": base64.b64encode(b"t0k\n").decode()}) == "t0k\n"
    with pytest.raises(SecretError, match=r"^Secret servegraph-system/events-token has no key 'token'$") as missing:
        secrets.value(ref, {"other": "eA=="})
    assert missing.value.reason == "KeyNotFound"
    with pytest.raises(SecretError, match="is not UTF-8 text") as binary:
        secrets.value(ref, {"token": base64.b64encode(b"\xff\xfe").decode()})
    assert binary.value.reason == "InvalidValue" and "\\xff" not in str(binary.value)


def test_mirror_upgrade_reads_kuberays_pending_cluster() -> None:
    assert mirror_upgrade(RAYSERVICE) is None
    assert mirror_upgrade(None) is None
    upgrading = {
        "status": {
            "conditions": [{"type": "UpgradeInProgress", "status": "True"}],
            "activeServiceStatus": {"rayClusterName": "mini-a"},
            "pendingServiceStatus": {
                "rayClusterName": "mini-b",
                "applicationStatuses": {"embed": {"status": "DEPLOYING"}, "sentiment": {"status": "RUNNING"}},
            },
        }
    }
    assert mirror_upgrade(upgrading) == {
        "activeRayCluster": "mini-a",
        "pendingRayCluster": "mini-b",
        "applications": {"embed": "DEPLOYING", "sentiment": "RUNNING"},
    }
    # The first cluster starting is pending with no active one: not an upgrade.
    first = {"status": {"pendingServiceStatus": {"rayClusterName": "mini-a"}}}
    assert mirror_upgrade(first) is None
    # The condition alone (KubeRay has not named the pending cluster yet) is enough.
    only_condition = {"status": {"conditions": [{"type": "UpgradeInProgress", "status": "True"}]}}
    assert mirror_upgrade(only_condition) == {"activeRayCluster": "", "pendingRayCluster": "", "applications": {}}
