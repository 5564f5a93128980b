"""A canary's steps and verdicts (operator/rollout/canary.py, analysis.py), by table."""

from __future__ import annotations

from typing import Any

import pytest

from servegraph.evidence import Counts, Evidence, NodeCounts
from servegraph.operator.conditions import rfc3339
from servegraph.operator.rollout.analysis import judge
from servegraph.operator.rollout.canary import (
    ABORTED,
    DEPLOYING,
    MIRRORING,
    NOT_CANARIED,
    PROMOTED,
    WEIGHTED,
    Facts,
    Split,
    advance,
    check_due,
    start,
)
from servegraph.operator.spec import Analysis, CanarySpec, CanaryStep, NodeThreshold, parse_spec

T0 = 1_800_000_000.0
DEADLINE = 600.0
TWO_STEPS = CanarySpec(steps=(CanaryStep(10, 60), CanaryStep(50, 60)), analysis=Analysis(min_requests=20))


def healthy(requests: int = 100, errors: int = 0, p99: float = 40.0, live_p99: float = 38.0) -> Evidence:
    return Evidence(
        "prometheus",
        canary=Counts(requests, errors, p99),
        live=Counts(requests * 9, 0, live_p99),
        nodes=(NodeCounts("a", "scorer", Counts(requests, errors, p99), live_p99),),
    )


def rare_node(requests: int) -> Evidence:
    """A healthy canary whose node "rare" answered `requests` of its requests 10x slower."""
    return Evidence(
        "routers",
        canary=Counts(400, 0, 40.0),
        live=Counts(3600, 0, 38.0),
        nodes=(NodeCounts("a", "rare", Counts(requests, 0, 400.0), 38.0),),
    )


def at(state: dict[str, Any], spec: CanarySpec, facts: Facts, seconds: float) -> Any:
    return advance(spec, state, facts, T0 + seconds, DEADLINE)


# -- analysis --------------------------------------------------------------------------------


VERDICTS: list[tuple[str, Evidence, Analysis, bool, str, str]] = [
    ("healthy", healthy(), Analysis(), False, "Pass", "error rate 0 % (0 of 100 requests), p99 40 ms"),
    ("too few requests", healthy(requests=5), Analysis(min_requests=20), False, "Waiting", "5 of the 20 requests"),
    (
        "10 % of requests fail, at one node",
        healthy(requests=200, errors=20),
        Analysis(),
        False,
        "Fail",
        'error rate 10 % (20 of 200 requests) over the 1 % allowed; most at application "a", node "scorer"',
    ),
    (
        "3x slower at p99",
        healthy(p99=120.0, live_p99=40.0),
        Analysis(max_latency_ratio=2.0),
        False,
        "Fail",
        'p99 120 ms over 100 requests, 3x the live version\'s 40 ms (at most 2x); slowest at application "a", node "scorer"',
    ),
    (
        "a node's own threshold",
        healthy(requests=100, errors=1),
        Analysis(max_error_rate=0.05, nodes=(NodeThreshold("a", "scorer", max_error_rate=0.005),)),
        False,
        "Fail",
        'application "a", node "scorer": error rate 1 % (1 of 100 requests) over its 0.5 %',
    ),
    (
        "one slow request in 43 is not a p99: no verdict yet",
        healthy(requests=43, p99=186.0, live_p99=51.0),
        Analysis(min_requests=40),
        False,
        "Waiting",
        "error rate 0 % (0 of 43 requests); its p99 is judged from 100 requests, 43 so far",
    ),
    (
        "errors are judged before the p99 can be",
        healthy(requests=43, errors=4, p99=186.0, live_p99=51.0),
        Analysis(min_requests=40),
        False,
        "Fail",
        "error rate 9.3 % (4 of 43 requests) over the 1 % allowed",
    ),
    (
        "a node's p99 over fewer than 100 of its requests is not judged",
        rare_node(99),
        Analysis(nodes=(NodeThreshold("a", "rare", max_latency_ratio=2.0),)),
        False,
        "Pass",
        "error rate 0 % (0 of 400 requests), p99 40 ms",
    ),
    (
        "a node's p99 over 100 of its requests is",
        rare_node(100),
        Analysis(nodes=(NodeThreshold("a", "rare", max_latency_ratio=2.0),)),
        False,
        "Fail",
        'application "a", node "rare": p99 400 ms over 100 requests, 11x the live version\'s 38 ms (at most 2x)',
    ),
    (
        "mirroring judges the copies, not the client requests",
        Evidence("routers", canary=Counts(), live=Counts(500, 0, 30), mirrored=Counts(100, 50, 30)),
        Analysis(),
        True,
        "Fail",
        "error rate 50 % (50 of 100 requests) over the 1 % allowed",
    ),
]


@pytest.mark.parametrize(
    ("why", "evidence", "analysis", "mirroring", "verdict", "reason"), VERDICTS, ids=[v[0] for v in VERDICTS]
)
def test_judge(why: str, evidence: Evidence, analysis: Analysis, mirroring: bool, verdict: str, reason: str) -> None:
    judged = judge(evidence, analysis, mirroring)
    assert judged.verdict == verdict
    assert reason in judged.reason


# -- the steps -------------------------------------------------------------------------------


def test_a_good_version_goes_deploying_step_by_step_to_promoted() -> None:
    step = start(TWO_STEPS, "2", "1", T0, refused=None)
    assert (step.phase, step.split) == (DEPLOYING, Split(0, 0))
    state = step.state
    step = at(state, TWO_STEPS, Facts(copies=None), 30)
    assert step.phase == DEPLOYING, "weight given before the new deployments run"
    step = at(state, TWO_STEPS, Facts(copies=True), 40)
    assert (step.phase, step.state["step"], step.split) == (WEIGHTED, 1, Split(10, 0))
    state = step.state
    step = at(state, TWO_STEPS, Facts(copies=True, evidence=healthy()), 70)
    assert (step.phase, step.state["step"]) == (WEIGHTED, 1), "its pause has not passed"
    state = step.state
    step = at(state, TWO_STEPS, Facts(copies=True, evidence=healthy()), 101)
    assert (step.phase, step.state["step"], step.split) == (WEIGHTED, 2, Split(50, 0))
    step = at(step.state, TWO_STEPS, Facts(copies=True, evidence=healthy()), 162)
    assert (step.phase, step.split, step.state["weight"]) == (PROMOTED, None, 100)
    assert [e[1] for e in step.events] == ["CanaryPromoted"]
    assert (step.state["version"], step.state["liveVersion"]) == ("2", "1"), "the ended canary names its versions"


def test_a_failing_version_is_aborted_at_the_first_failed_check_naming_the_node() -> None:
    state = at(start(TWO_STEPS, "2", "1", T0, None).state, TWO_STEPS, Facts(copies=True), 10).state
    step = at(state, TWO_STEPS, Facts(copies=True, evidence=healthy(requests=100, errors=10)), 25)
    assert (step.phase, step.split) == (ABORTED, None)
    assert 'node "scorer"' in step.state["message"] and "10 %" in step.state["message"]
    assert step.events[0][:2] == ("Warning", "CanaryAborted")
    assert step.state["evidence"]["verdict"] == "Fail"


def test_failed_checks_count_up_to_the_limit() -> None:
    spec = CanarySpec(steps=(CanaryStep(10, 600),), analysis=Analysis(failure_limit=2))
    state = at(start(spec, "2", "1", T0, None).state, spec, Facts(copies=True), 1).state
    failing = Facts(copies=True, evidence=healthy(errors=50))
    state = at(state, spec, failing, 20).state
    assert (state["phase"], state["failedChecks"]) == (WEIGHTED, 1)
    assert at(state, spec, failing, 40).phase == ABORTED


def test_a_step_holds_past_its_pause_until_its_p99_is_judged() -> None:
    spec = CanarySpec(steps=(CanaryStep(10, 20),), analysis=Analysis(min_requests=40))
    state = at(start(spec, "2", "1", T0, None).state, spec, Facts(copies=True), 1).state
    cold = Facts(copies=True, evidence=healthy(requests=60, p99=190.0, live_p99=50.0))
    step = at(state, spec, cold, 30)
    assert (step.phase, step.state["evidence"]["verdict"], step.state["failedChecks"]) == (WEIGHTED, "Waiting", 0)
    diluted = Facts(copies=True, evidence=healthy(requests=120, p99=60.0, live_p99=50.0))
    assert at(step.state, spec, diluted, 35).phase == PROMOTED


def test_with_a_mirror_the_copies_come_first_then_the_steps() -> None:
    spec = CanarySpec(steps=(CanaryStep(20, 60),), mirror_percent=20, mirror_pause_s=60, sticky_header="x-user")
    step = at(start(spec, "2", "1", T0, None).state, spec, Facts(copies=True), 5)
    assert (step.phase, step.split) == (MIRRORING, Split(0, 20, "x-user", None))
    mirrored = Evidence("prometheus", Counts(), Counts(500, 0, 30), mirrored=Counts(100, 0, 30))
    step = at(step.state, spec, Facts(copies=True, evidence=mirrored), 70)
    assert (step.phase, step.split) == (WEIGHTED, Split(20, 0, "x-user", None))


def test_too_little_traffic_never_promotes_and_ends_at_the_deadline() -> None:
    state = at(start(TWO_STEPS, "2", "1", T0, None).state, TWO_STEPS, Facts(copies=True), 1).state
    quiet = Facts(copies=True, evidence=healthy(requests=3))
    step = at(state, TWO_STEPS, quiet, 300)
    assert (step.phase, step.state["evidence"]["verdict"]) == (WEIGHTED, "Waiting")
    step = at(step.state, TWO_STEPS, quiet, 1 + 60 + DEADLINE + 1)
    assert step.phase == ABORTED and "too little traffic" in step.state["message"]


def test_deployments_that_fail_or_never_run_abort_it() -> None:
    state = start(TWO_STEPS, "2", "1", T0, None).state
    failed = at(state, TWO_STEPS, Facts(copies=False, copies_message="scorer: DEPLOY_FAILED: ImportError"), 10)
    assert failed.phase == ABORTED and "ImportError" in failed.state["message"]
    assert at(state, TWO_STEPS, Facts(copies=None), DEADLINE + 1).phase == ABORTED


def test_promote_and_abort_by_hand_act_once() -> None:
    state = at(start(TWO_STEPS, "2", "1", T0, None).state, TWO_STEPS, Facts(copies=True), 1).state
    promoted = at(state, TWO_STEPS, Facts(copies=True, action="promote", action_value="promote@T"), 2)
    assert promoted.phase == PROMOTED and promoted.state["actionSeen"] == "promote@T"
    aborted = at(state, TWO_STEPS, Facts(copies=True, action="abort", action_value="abort@T"), 2)
    assert aborted.phase == ABORTED and "servegraph abort" in aborted.state["message"]
    assert at(aborted.state, TWO_STEPS, Facts(copies=True, evidence=healthy()), 500).phase == ABORTED, "an end is final"


def test_a_version_that_cannot_be_canaried_says_why() -> None:
    step = start(TWO_STEPS, "2", "1", T0, refused='the ingress of application "a" is user code that changed')
    assert (step.phase, step.split, step.state["version"]) == (NOT_CANARIED, None, "2")
    assert step.events[0][:2] == ("Warning", "NotCanaried") and "user code" in step.events[0][2]


def test_a_check_is_due_each_interval_while_weighted() -> None:
    state = {"phase": WEIGHTED, "stepStartedAt": rfc3339(T0)}
    assert check_due(TWO_STEPS, state, T0)
    state["evidence"] = {"at": rfc3339(T0)}
    assert not check_due(TWO_STEPS, state, T0 + 10) and check_due(TWO_STEPS, state, T0 + 15)
    assert not check_due(TWO_STEPS, {"phase": DEPLOYING}, T0)


def test_canary_spec_defaults_and_fields() -> None:
    source = {"url": "https://r/g", "tokenSecretRef": {"name": "t"}}
    assert parse_spec({"source": source, "rollout": {"canary": {}}}, "ns").rollout.canary == CanarySpec()
    assert parse_spec({"source": source}, "ns").rollout.canary is None
    spec = parse_spec(
        {
            "source": source,
            "rollout": {
                "canary": {
                    "steps": [{"weight": 5, "pause": "30s"}, {"weight": 25}],
                    "analysis": {"minRequests": 0, "maxErrorRate": 0.02, "nodes": [{"application": "a", "node": "n"}]},
                    "mirror": {"percent": 10},
                    "stickyKey": {"field": "user"},
                    "onPublish": "Queue",
                }
            },
        },
        "ns",
    ).rollout.canary
    assert spec is not None
    assert spec.steps == (CanaryStep(5, 30.0), CanaryStep(25, 60.0))
    assert (spec.analysis.min_requests, spec.analysis.max_error_rate) == (0, 0.02)
    assert (spec.mirror_percent, spec.sticky_field, spec.queue_publishes) == (10, "user", True)
