"""`status.report`, by table: what the reconcile observed → the status patch, the log
transitions and the Events, from the status already written."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from support import SAMPLES

from servegraph.graph import load_graph
from servegraph.operator.conditions import Condition
from servegraph.operator.status import Event, GoodGraph, Observed, Outcome, report

GRAPH = load_graph(SAMPLES / "mini.pb")
GOOD = GoodGraph(GRAPH, "ab" * 32)
NEWER = GoodGraph(GRAPH, "cd" * 32)
T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"

FETCHED = Condition("Fetched", True, "Downloaded", "downloaded 300 bytes from https://r/mini")
NOT_MODIFIED = Condition("Fetched", True, "NotModified", 'https://r/mini has not changed (ETag "e1")')
UNAUTHORIZED = Condition("Fetched", False, "Unauthorized", "https://r/mini answered HTTP 401")
VALID = Condition("GraphValid", True, "Valid", "graph mini version '1': 1 applications, 2 nodes")
INVALID = Condition("GraphValid", False, "InvalidGraph", "cannot decode binary protobuf")
APPLIED = Condition("Applied", True, "UpToDate", "RayService mini matches the graph and spec")
NO_GRAPH = Condition("Applied", False, "NoValidGraph", "no valid graph has been downloaded yet")
RUNNING = {"sentiment": {"status": "RUNNING", "deployments": {}}}
UPGRADE = {"activeRayCluster": "mini-a", "pendingRayCluster": "mini-b", "applications": {"sentiment": "DEPLOYING"}}


def steady() -> dict[str, Any]:
    """The status after a first successful reconcile at T0, applications not reported yet."""
    observed = Observed(Outcome(FETCHED, VALID, APPLIED), GOOD, '"e1"', "mini", {})
    return report({}, 1, observed, T0).status


@dataclass
class Row:
    id: str
    old: dict[str, Any]
    observed: Observed
    patched: set[str]
    """Top-level status fields the patch writes (empty: no write at all)."""
    transitions: list[tuple[str, str, str]]
    """(type, status, reason) of the conditions logged as changed."""
    events: list[tuple[str, str]]
    conditions: dict[str, tuple[str, str]] = field(default_factory=dict)
    """type → (status, reason) expected in the new status, for the conditions that matter."""


ROWS = [
    Row(
        "first download and apply",
        {},
        Observed(
            Outcome(FETCHED, VALID, APPLIED, [Event("Normal", "Fetched", "f"), Event("Normal", "Applied", "a")]),
            GOOD,
            '"e1"',
            "mini",
            {},
        ),
        {"observedGeneration", "conditions", "graph", "source", "rayServiceName", "applications"},
        [
            ("Fetched", "True", "Downloaded"),
            ("GraphValid", "True", "Valid"),
            ("Applied", "True", "UpToDate"),
            ("Ready", "False", "WaitingForApplications"),
        ],
        [("Normal", "Applied")],  # one Normal event: Applied says what Fetched would
    ),
    Row(
        "nothing changed: no write, nothing to say",
        steady(),
        Observed(Outcome(applied=APPLIED), GOOD, '"e1"', "mini", {}),
        set(),
        [],
        [],
    ),
    Row(
        "a Normal event without a status change is still posted",
        steady(),
        Observed(Outcome(applied=APPLIED, events=[Event("Normal", "Applied", "updated")]), GOOD, '"e1"', "mini", {}),
        set(),
        [],
        [("Normal", "Applied")],
    ),
    Row(
        "the registry refuses after a good download: the graph keeps running",
        steady(),
        Observed(Outcome(fetched=UNAUTHORIZED, applied=APPLIED), GOOD, '"e1"', "mini", {}),
        {"conditions"},
        [("Fetched", "False", "Unauthorized")],
        [("Warning", "FetchFailed")],
        {"Fetched": ("False", "Unauthorized"), "GraphValid": ("True", "Valid"), "Applied": ("True", "UpToDate")},
    ),
    Row(
        "the same failure again: no write and no second warning",
        report(
            steady(), 1, Observed(Outcome(fetched=UNAUTHORIZED, applied=APPLIED), GOOD, '"e1"', "mini", {}), T1
        ).status,
        Observed(Outcome(fetched=UNAUTHORIZED, applied=APPLIED), GOOD, '"e1"', "mini", {}),
        set(),
        [],
        [],
    ),
    Row(
        "not modified: a new reason is logged but warns nobody",
        steady(),
        Observed(Outcome(fetched=NOT_MODIFIED, applied=APPLIED), GOOD, '"e1"', "mini", {}),
        {"conditions"},
        [("Fetched", "True", "NotModified")],
        [],
    ),
    Row(
        "an invalid first graph: no graph in the status, Ready says why",
        {},
        Observed(Outcome(FETCHED, INVALID, NO_GRAPH), None, None, None, None),
        {"observedGeneration", "conditions"},
        [
            ("Fetched", "True", "Downloaded"),
            ("GraphValid", "False", "InvalidGraph"),
            ("Applied", "False", "NoValidGraph"),
            ("Ready", "False", "NoValidGraph"),
        ],
        [("Warning", "InvalidGraph"), ("Warning", "ApplyFailed")],
    ),
    Row(
        "every application RUNNING: Ready",
        steady(),
        Observed(Outcome(applied=APPLIED), GOOD, '"e1"', "mini", RUNNING),
        {"conditions", "applications"},
        [("Ready", "True", "AllApplicationsRunning")],
        [],
    ),
    Row(
        "the RayService is gone: Ready turns False",
        steady(),
        Observed(Outcome(applied=APPLIED), GOOD, '"e1"', "mini", None),
        {"conditions"},
        [("Ready", "False", "RayServiceMissing")],
        [],
    ),
    Row(
        "KubeRay builds a new cluster: not Ready while the old one serves, and the status says so",
        report(steady(), 1, Observed(Outcome(applied=APPLIED), GOOD, '"e1"', "mini", RUNNING), T1).status,
        Observed(Outcome(applied=APPLIED), GOOD, '"e1"', "mini", RUNNING, UPGRADE),
        {"conditions", "upgrade"},
        [("Ready", "False", "UpgradeInProgress")],
        [],
    ),
    Row(
        "the upgrade is done: Ready again and the upgrade leaves the status",
        report(steady(), 1, Observed(Outcome(applied=APPLIED), GOOD, '"e1"', "mini", RUNNING, UPGRADE), T1).status,
        Observed(Outcome(applied=APPLIED), GOOD, '"e1"', "mini", RUNNING),
        {"conditions", "upgrade"},
        [("Ready", "True", "AllApplicationsRunning")],
        [],
    ),
    Row(
        "a new graph: its digest and a new fetch time",
        steady(),
        Observed(Outcome(FETCHED, VALID, APPLIED), NEWER, '"e2"', "mini", {}),
        {"graph", "source"},
        [],
        [],
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_report(row: Row) -> None:
    result = report(row.old, 1, row.observed, T1)
    assert set(result.patch) == row.patched
    assert [(c["type"], c["status"], c["reason"]) for c in result.transitions] == row.transitions
    assert [(e.type, e.reason) for e in result.events] == row.events
    got = {c["type"]: (c["status"], c["reason"]) for c in result.status["conditions"]}
    for type_, expected in row.conditions.items():
        assert got[type_] == expected


def test_a_transition_time_moves_only_when_the_status_does() -> None:
    old = steady()
    flipped = report(old, 1, Observed(Outcome(fetched=UNAUTHORIZED, applied=APPLIED), GOOD, '"e1"', "mini", {}), T1)
    times = {c["type"]: c["lastTransitionTime"] for c in flipped.status["conditions"]}
    assert times == {"Fetched": T1, "GraphValid": T0, "Applied": T0, "Ready": T0}


def test_the_fetch_time_moves_with_the_digest_not_with_every_download() -> None:
    old = steady()
    same = report(old, 1, Observed(Outcome(FETCHED, VALID, APPLIED), GOOD, '"e1"', "mini", {}), T1)
    newer = report(old, 1, Observed(Outcome(FETCHED, VALID, APPLIED), NEWER, '"e2"', "mini", {}), T1)
    assert same.status["source"]["lastFetchTime"] == T0
    assert newer.status["source"] == {"etag": '"e2"', "lastFetchTime": T1}
    assert newer.patch["graph"] == {"digest": "sha256:" + "cd" * 32, "shortDigest": "cd" * 6}


def test_warnings_carry_the_reason_and_message() -> None:
    result = report(steady(), 1, Observed(Outcome(fetched=UNAUTHORIZED, applied=APPLIED), GOOD, None, "mini", {}), T1)
    assert result.events == [Event("Warning", "FetchFailed", "Unauthorized: https://r/mini answered HTTP 401")]


def test_the_generation_is_recorded_on_the_status_and_on_each_condition() -> None:
    result = report(steady(), 7, Observed(Outcome(applied=APPLIED), GOOD, '"e1"', "mini", {}), T1)
    assert result.patch["observedGeneration"] == 7
    assert {c["observedGeneration"] for c in result.status["conditions"]} == {7}


def test_the_upgrade_message_names_both_clusters_and_the_pending_applications() -> None:
    status = report(steady(), 1, Observed(Outcome(), GOOD, '"e1"', "mini", RUNNING, UPGRADE), T1).status
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["message"] == (
        "KubeRay is starting Ray cluster mini-b for this version (sentiment: DEPLOYING); "
        "mini-a serves the previous one until then"
    )
    assert status["upgrade"] == UPGRADE
