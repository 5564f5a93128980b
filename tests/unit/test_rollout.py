"""Rollout decisions (operator/rollout/decide.py): when a version is done, failed, rolled back."""

from __future__ import annotations

from typing import Any

import pytest

from servegraph.operator.rollout.canary import Gate
from servegraph.operator.rollout.decide import (
    FAILED,
    PROGRESSING,
    ROLLED_BACK,
    SERVING,
    STABLE_S,
    SUPERSEDED,
    Candidate,
    Decision,
    Health,
    decide,
    parse_rfc3339,
    rfc3339,
)
from servegraph.operator.rollout.step import with_upgrade
from servegraph.operator.spec import CanarySpec, RolloutSpec

T0 = 1_800_000_000.0
SPEC = RolloutSpec(progress_deadline_s=300)
V1 = Candidate("a" * 64, "1", "https://r/g")
V2 = Candidate("b" * 64, "2", "https://r/g")
V3 = Candidate("c" * 64, "3", "https://r/g")
RUNNING = Health(True, {"app": {"status": "RUNNING"}}, None, ("app",))


def step(
    status: dict[str, Any], candidate: Candidate | None, health: Health | None, now: float, **spec: Any
) -> Decision:
    kept = [h["digest"] for h in status.get("history") or [] if h.get("rollbackAvailable", True)]
    return decide(RolloutSpec(**{"progress_deadline_s": 300, **spec}), candidate, status, kept, health, now)


def apply(status: dict[str, Any], d: Decision) -> dict[str, Any]:
    """What the reconcile writes back into the status."""
    out = dict(status)
    if d.rollout is not None:
        out["rollout"] = d.rollout
    out["history"] = d.history
    return out


def settle(status: dict[str, Any], candidate: Candidate, at: float) -> dict[str, Any]:
    """Every application RUNNING at `at` and still after the stable window."""
    status = apply(status, step(status, candidate, RUNNING, at))
    return apply(status, step(status, candidate, RUNNING, at + STABLE_S))


def failing(status: dict[str, Any], candidate: Candidate, health: Health, at: float, **spec: Any) -> Decision:
    """Ray reports `health` at `at` and still after the stable window: the decision then."""
    first = step(status, candidate, health, at, **spec)
    assert first.outcome is None, "a failure right after a push may still be the previous version's"
    return step(apply(status, first), candidate, health, at + STABLE_S, **spec)


def serving(candidate: Candidate = V1) -> dict[str, Any]:
    """A status where `candidate` rolled out and is Ready."""
    return settle(apply({}, step({}, candidate, None, T0)), candidate, T0 + 10)


def outcomes(d: Decision) -> list[tuple[str, str]]:
    return [(h["version"], h["outcome"]) for h in d.history]


def test_a_first_version_rolls_out_and_completes_when_every_application_runs() -> None:
    d = step({}, V1, None, T0)
    assert d.target == V1.digest
    assert d.rollout is not None and d.rollout["phase"] == PROGRESSING
    assert d.rollout["deadline"] == rfc3339(T0 + 300)
    assert outcomes(d) == [("1", PROGRESSING)]
    assert d.progressing is not None and d.progressing.reason == "RollingOut"

    status = apply({}, d)
    unsettled = Health(False, {"app": {"status": "RUNNING"}}, None, ("app",))
    assert step(status, V1, unsettled, T0 + 5).outcome is None, "KubeRay has not acted on the new spec yet"
    first = step(status, V1, RUNNING, T0 + 10)
    assert first.outcome is None, "RUNNING right after the push may still be the old version's"
    assert first.seconds_to_deadline(T0 + 10) == STABLE_S + 1, "looked at again when the window ends"
    status = apply(status, first)
    flicker = Health(True, {"app": {"status": "DEPLOYING"}}, None, ("app",))
    assert "runningSince" not in (step(status, V1, flicker, T0 + 12).rollout or {}), "the window starts over"
    done = step(status, V1, RUNNING, T0 + 10 + STABLE_S)
    assert done.outcome == SERVING
    assert outcomes(done) == [("1", SERVING)]
    assert done.history[0]["readyAt"] == rfc3339(T0 + 10 + STABLE_S)
    assert done.events == [("Normal", "RolloutComplete", "version '1' is Ready")]


def test_a_new_version_supersedes_the_old_once_ready() -> None:
    status = serving()
    d = step(status, V2, RUNNING, T0 + 40)
    assert d.target == V2.digest and outcomes(d) == [("2", PROGRESSING), ("1", SERVING)]
    status = settle(apply(status, d), V2, T0 + 50)
    assert [(h["version"], h["outcome"]) for h in status["history"]] == [("2", SERVING), ("1", SUPERSEDED)]


def test_an_upgrade_in_progress_is_not_done() -> None:
    status = apply(serving(), step(serving(), V2, RUNNING, T0 + 40))
    upgrading = Health(True, {"app": {"status": "RUNNING"}}, {"applications": {"app": "DEPLOYING"}}, ("app",))
    assert step(status, V2, upgrading, T0 + 30).outcome is None


def test_a_failed_application_rolls_back_to_the_last_ready_version() -> None:
    status = apply(serving(), step(serving(), V2, RUNNING, T0 + 40))
    failed = Health(True, {"app": {"status": "DEPLOY_FAILED", "message": "boom in __init__"}}, None, ("app",))
    d = failing(status, V2, failed, T0 + 40)
    assert d.outcome == ROLLED_BACK
    assert d.target == V1.digest, "the last Ready version runs again"
    assert outcomes(d) == [("1", PROGRESSING), ("2", ROLLED_BACK), ("1", SERVING)]
    assert "app: DEPLOY_FAILED: boom in __init__" in d.history[1]["message"]
    assert d.progressing is not None and d.progressing.reason == "RolledBack"
    (event,) = d.events
    assert event[:2] == ("Warning", "RolledBack") and "rolling back to version '1'" in event[2]

    status = apply(status, d)
    # The source still serves v2: it is not retried.
    status = settle(status, V2, T0 + 50)
    assert status["rollout"]["digest"] == V1.digest and status["rollout"]["phase"] == SERVING
    assert status["history"][0]["version"] == "1" and status["history"][0]["outcome"] == SERVING
    assert step(status, V2, RUNNING, T0 + 90).target == V1.digest
    # A different version is tried.
    assert step(status, V3, RUNNING, T0 + 70).target == V3.digest


def test_a_failure_after_the_new_version_was_seen_deploying_counts_at_once() -> None:
    status = apply(serving(), step(serving(), V2, RUNNING, T0 + 40))
    deploying = step(status, V2, Health(True, {"app": {"status": "DEPLOYING"}}, None, ("app",)), T0 + 42)
    assert deploying.outcome is None
    status = apply(status, deploying)
    failed = Health(True, {"app": {"status": "DEPLOY_FAILED"}}, None, ("app",))
    d = step(status, V2, failed, T0 + 44)
    assert d.outcome == ROLLED_BACK and d.target == V1.digest, "no need to wait: the failure is v2's"
    assert d.rollout is not None and "deploySeen" not in d.rollout, "the rollback starts unseen"


def test_the_bad_versions_failure_still_shown_after_a_rollback_does_not_fail_it() -> None:
    """Found on the node: right after v1 is pushed again, KubeRay still shows v2's DEPLOY_FAILED."""
    status = apply(serving(), step(serving(), V2, RUNNING, T0 + 40))
    failed = Health(True, {"app": {"status": "DEPLOY_FAILED"}}, None, ("app",))
    status = apply(status, failing(status, V2, failed, T0 + 40))
    assert status["rollout"]["cause"] == "rollback"
    stale = step(status, V2, failed, T0 + 60)
    assert stale.outcome is None and stale.target == V1.digest
    assert stale.progressing is not None and stale.progressing.reason == "RollingBack"
    status = apply(status, stale)
    assert "failingSince" in status["rollout"]
    deploying = step(status, V2, Health(True, {"app": {"status": "DEPLOYING"}}, None, ("app",)), T0 + 62)
    assert deploying.rollout is not None and "failingSince" not in deploying.rollout, "the failure window starts over"
    status = settle(apply(status, deploying), V2, T0 + 64)
    assert status["rollout"]["phase"] == SERVING and status["rollout"]["digest"] == V1.digest
    assert outcomes_of(status) == [("1", SERVING), ("2", ROLLED_BACK), ("1", SUPERSEDED)]


def outcomes_of(status: dict[str, Any]) -> list[tuple[str, str]]:
    return [(h["version"], h["outcome"]) for h in status["history"]]


def test_the_progress_deadline_rolls_back_too() -> None:
    status = apply(serving(), step(serving(), V2, RUNNING, T0 + 40))
    stuck = Health(True, {"app": {"status": "DEPLOYING"}}, None, ("app",))
    assert step(status, V2, stuck, T0 + 40 + 300).outcome is None  # v2 started at T0 + 40
    d = step(status, V2, stuck, T0 + 40 + 301)
    assert d.outcome == ROLLED_BACK and d.target == V1.digest
    assert d.history[1]["message"].startswith("ProgressDeadlineExceeded")


def test_a_failure_in_the_pending_cluster_counts() -> None:
    status = apply(serving(), step(serving(), V2, RUNNING, T0 + 40))
    pending_failed = Health(True, {"app": {"status": "RUNNING"}}, {"applications": {"new": "DEPLOY_FAILED"}}, ("app",))
    assert failing(status, V2, pending_failed, T0 + 40).outcome == ROLLED_BACK


def test_without_auto_rollback_the_version_stays_and_fails() -> None:
    status = apply(serving(), step(serving(), V2, RUNNING, T0 + 20, auto_rollback=False))
    failed = Health(True, {"app": {"status": "UNHEALTHY"}}, None, ("app",))
    d = failing(status, V2, failed, T0 + 40, auto_rollback=False)
    assert d.outcome == FAILED and d.target == V2.digest
    assert d.progressing is not None and "autoRollback is off" in d.progressing.message


def test_no_rollback_without_a_kept_graph() -> None:
    status = serving()
    status["history"][0]["rollbackAvailable"] = False  # too large to keep
    status = apply(status, step(status, V2, RUNNING, T0 + 40))
    failed = Health(True, {"app": {"status": "DEPLOY_FAILED"}}, None, ("app",))
    d = failing(status, V2, failed, T0 + 40)
    assert d.outcome == FAILED and d.target == V2.digest
    assert d.progressing is not None and "rollback unavailable" in d.progressing.message


def test_a_failed_rollback_does_not_loop() -> None:
    status = apply(serving(), step(serving(), V2, RUNNING, T0 + 40))
    failed = Health(True, {"app": {"status": "DEPLOY_FAILED"}}, None, ("app",))
    status = apply(status, failing(status, V2, failed, T0 + 40))  # rolled back to v1
    d = failing(status, V2, failed, T0 + 60)  # ... and v1 fails too
    assert d.outcome == FAILED and d.target == V1.digest
    assert d.progressing is not None and "rollback already" in d.progressing.message


def test_a_pin_runs_a_kept_version_and_ignores_the_source() -> None:
    status = settle(apply(serving(), step(serving(), V2, RUNNING, T0 + 40)), V2, T0 + 50)  # v2 Serving
    d = step(status, V3, RUNNING, T0 + 40, pin_digest=V1.digest)
    assert d.target == V1.digest and d.rollout is not None and d.rollout["cause"] == "pin"
    d = step(status, V3, RUNNING, T0 + 40, pin_version="2")
    assert d.target == V2.digest
    missing = step(status, V3, RUNNING, T0 + 40, pin_version="9")
    assert missing.target == V2.digest, "an unknown pin changes nothing"
    assert missing.progressing is not None and missing.progressing.reason == "PinUnavailable"


def test_history_is_bounded_but_keeps_the_rollback_target() -> None:
    status = serving()
    for i in range(12):
        c = Candidate(f"{i:064x}", f"v{i}", "u")
        status = apply(status, step(status, c, RUNNING, T0 + 100 + i))  # never Ready
    d = step(status, Candidate("f" * 64, "last", "u"), RUNNING, T0 + 200, history_limit=5)
    assert len(d.history) == 5
    assert [h["outcome"] for h in d.history[1:4]] == [SUPERSEDED] * 3
    assert "before it was Ready" in d.history[1]["message"]
    assert d.history[-1]["version"] == "1", "the last Ready version stays as the rollback target"


def test_progressing_and_a_missed_deadline_name_the_first_blocking_problem() -> None:
    why = 'application "app": deployment "n3": 1 replicas ... not scheduled ... total resources available: {}'
    status = apply({}, step({}, V1, None, T0))
    stuck = Health(True, {}, None, ("app",), blocker=why)
    d = step(status, V1, stuck, T0 + 20)
    assert d.progressing is not None and d.progressing.message == f"rolling out version '1' ({V1.digest[:12]}); {why}"
    failed = step(status, V1, stuck, T0 + 301)
    assert failed.outcome == FAILED and failed.progressing is not None
    assert failed.progressing.reason == "ProgressDeadlineExceeded"
    assert failed.progressing.message.startswith(f"not Ready within the progress deadline ({rfc3339(T0 + 300)}); {why}")
    assert failed.history[0]["message"] == "ProgressDeadlineExceeded: not Ready within the progress deadline " + (
        f"({rfc3339(T0 + 300)}); {why}"
    )


def test_the_predicted_upgrade_is_recorded_on_a_new_decision() -> None:
    """What KubeRay will make of the apply reaches the rollout and its history entry, on a new
    Decision: the one decide returned is not edited (issue 24)."""
    rollout = {"version": "2", "phase": PROGRESSING}
    decision = Decision(target="d2", rollout=rollout, history=[{"version": "2"}, {"version": "1"}])
    recorded = with_upgrade(decision, "NewCluster")
    assert recorded.rollout == {"version": "2", "phase": PROGRESSING, "upgrade": "NewCluster"}
    assert recorded.history == [{"version": "2", "upgrade": "NewCluster"}, {"version": "1"}]
    assert decision.rollout == {"version": "2", "phase": PROGRESSING}
    assert decision.history == [{"version": "2"}, {"version": "1"}]
    # A rollout that already says, and no rollout at all, stay as they are.
    said = Decision(target="d2", rollout={"upgrade": "InPlace"}, history=[])
    assert with_upgrade(said, "NewCluster") is said
    none = Decision(target=None, rollout=None, history=[])
    assert with_upgrade(none, "NewCluster") is none


def test_a_status_time_reads_back_to_the_second_and_a_time_without_zone_is_refused() -> None:
    for epoch in (0.0, T0, T0 + 300, 4102444800.0):
        assert parse_rfc3339(rfc3339(epoch)) == epoch
    with pytest.raises(ValueError, match="not a UTC time"):
        parse_rfc3339("2026-11-26T11:41:12")  # local time: which zone?
    with pytest.raises(ValueError):
        parse_rfc3339("yesterday Z")


# -- a canary gates its rollout (rollout/canary.py's Gate) --------------------------------------


def test_a_rollout_held_open_by_its_canary_neither_completes_nor_misses_its_deadline() -> None:
    status = apply(serving(), step(serving(), V2, None, T0 + 100))
    held = Gate(hold=True)
    for at in (T0 + 110, T0 + 110 + STABLE_S, T0 + 100 + 10_000):  # RUNNING throughout, far past the deadline
        d = decide(SPEC, V2, status, [V1.digest, V2.digest], RUNNING, at, held)
        status = apply(status, d)
        assert d.outcome is None and d.rollout is not None and d.rollout["phase"] == "Progressing"
    ended = T0 + 10_110  # the canary promoted: the deadline counts from its end
    status = apply(status, decide(SPEC, V2, status, [V1.digest, V2.digest], RUNNING, ended))
    done = decide(SPEC, V2, status, [V1.digest, V2.digest], RUNNING, ended + STABLE_S)
    assert done.outcome == "Serving", "once the canary no longer holds it, the rollout completes"


def test_an_aborted_canary_rolls_its_version_back_at_once_naming_why() -> None:
    status = apply(serving(), step(serving(), V2, None, T0 + 100))
    aborted = Gate(fail=("CanaryAborted", 'error rate 10 % over the 1 % allowed; most at node "scorer"'))
    d = decide(SPEC, V2, status, [V1.digest, V2.digest], RUNNING, T0 + 110, aborted)
    assert d.outcome == "RolledBack" and d.target == V1.digest
    assert outcomes(d)[:2] == [("1", "Progressing"), ("2", "RolledBack")]
    assert 'node "scorer"' in d.history[1]["message"]


def test_a_publish_during_a_canary_waits_when_it_queues() -> None:
    status = apply(serving(), step(serving(), V2, None, T0 + 100))
    status["rollout"]["canary"] = {"phase": "Weighted", "step": 1}
    queued = RolloutSpec(progress_deadline_s=300, canary=CanarySpec(queue_publishes=True))
    d = decide(queued, V3, status, [V1.digest, V2.digest], RUNNING, T0 + 120)
    assert d.target == V2.digest, "the running canary was replaced though publishes queue"
    restarted = decide(RolloutSpec(progress_deadline_s=300, canary=CanarySpec()), V3, status, [], RUNNING, T0 + 120)
    assert restarted.target == V3.digest and outcomes(restarted)[1] == ("2", "Superseded")
