"""A version's canary, step by step, decided (pure): `status.rollout.canary` is its state.

Phases, in order (docs/rollouts.md):

    Deploying ──► Mirroring ──► Weighted step 1 … n ──► Promoted
        │             │               │
        └─────────────┴───────────────┴──► Aborted          NotCanaried: refused at the start

- Deploying: the new version's changed deployments start beside the live ones (weight 0);
  they must be RUNNING within the progress deadline.
- Mirroring (with `mirror.percent`): copies of live requests, held `mirror.pause` with the
  analysis passing on the mirrored evidence.
- Weighted: each step's weight held its `pause` with the analysis passing.
- A failed check counts; `failureLimit` of them in one phase abort. Too few requests for a
  verdict hold the step; past its pause and the progress deadline, the canary is aborted
  (never promoted without evidence).
- `servegraph promote` / `abort` (the `servegraph.io/canary` annotation) end it at once.

Everything is in the status, so a new leader resumes at the same step with the same clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from servegraph.evidence import Evidence
from servegraph.names import ConditionType
from servegraph.operator.conditions import Condition, parse_rfc3339, rfc3339
from servegraph.operator.rollout.analysis import evidence_status, judge
from servegraph.operator.spec import CanarySpec
from servegraph.render.canary import Split

DEPLOYING, MIRRORING, WEIGHTED = "Deploying", "Mirroring", "Weighted"
PROMOTED, ABORTED, NOT_CANARIED = "Promoted", "Aborted", "NotCanaried"
ENDED = (PROMOTED, ABORTED, NOT_CANARIED)
PROMOTE, ABORT = "promote", "abort"
CANARY_RUNS = (DEPLOYING, MIRRORING, WEIGHTED)


@dataclass(frozen=True)
class Gate:
    """What a canary in progress says to its rollout (rollout/decide.py): hold it open (no
    completion, no deadline: the canary keeps its own per phase), or fail it now."""

    hold: bool = False
    fail: tuple[str, str] | None = None
    """(reason, message) of an aborted canary: the rollout fails, and rolls back, at once."""


@dataclass(frozen=True)
class Facts:
    """What the rollout step observed for the canary."""

    copies: bool | None = None
    """The new version's deployments: True RUNNING, False failed, None not (yet) known."""
    copies_message: str = ""
    evidence: Evidence | None = None
    """Read for this check (None: no check is due, or none could be read)."""
    action: str | None = None
    """`promote` or `abort` asked for and not yet acted on (the annotation's value changed)."""
    action_value: str | None = None
    refused: str | None = None
    """Why this version cannot be canaried (decided at its start)."""


@dataclass(frozen=True)
class Step:
    """The next canary state, and what it means for the rollout."""

    state: dict[str, Any]
    split: Split | None
    """The route to render (None: no canary route: promoted, aborted or not canaried)."""
    events: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def phase(self) -> str:
        return str(self.state["phase"])


def start(spec: CanarySpec, version: str, live_version: str, now: float, refused: str | None) -> Step:
    """A new version's canary: Deploying, or NotCanaried when it cannot be one."""
    if refused is not None:
        state: dict[str, Any] = {
            "phase": NOT_CANARIED,
            "message": refused[:2048],
            "version": version,
            "liveVersion": live_version,
        }
        why = f"version {version!r} is not canaried: {refused}"
        return Step(state, None, [("Warning", "NotCanaried", why)])
    state = {
        "phase": DEPLOYING,
        "step": 0,
        "steps": len(spec.steps),
        "weight": 0,
        "mirror": 0,
        "version": version,
        "liveVersion": live_version,
        "stepStartedAt": rfc3339(now),
        "failedChecks": 0,
    }
    return Step(state, _split(spec, DEPLOYING, 0))


def advance(spec: CanarySpec, current: Mapping[str, Any], facts: Facts, now: float, deadline_s: float) -> Step:
    """The canary's next state from the last one and what was observed now."""
    state = dict(current)
    phase = state["phase"]
    if phase in ENDED:
        return Step(state, None)
    if facts.action is not None:
        state["actionSeen"] = facts.action_value
        if facts.action == ABORT:
            return _abort(state, "aborted by `servegraph abort` (the servegraph.io/canary annotation)", now)
        return _promote(state, "promoted by `servegraph promote` (the servegraph.io/canary annotation)", now)
    if facts.copies is False:
        return _abort(state, f"the new version's deployments failed: {facts.copies_message}", now)
    since = now - parse_rfc3339(state["stepStartedAt"])
    if phase == DEPLOYING:
        if facts.copies:
            return _next(spec, state, now)
        if since > deadline_s:
            return _abort(state, f"its deployments were not RUNNING within {deadline_s:g}s", now)
        return Step(state, _split(spec, phase, 0))
    pause = spec.mirror_pause_s if phase == MIRRORING else spec.steps[int(state["step"]) - 1].pause_s
    if facts.evidence is not None:
        judged = judge(facts.evidence, spec.analysis, mirroring=phase == MIRRORING)
        state["evidence"] = evidence_status(facts.evidence, judged, rfc3339(now))
        if judged.verdict == "Fail":
            state["failedChecks"] = int(state.get("failedChecks") or 0) + 1
            if state["failedChecks"] >= spec.analysis.failure_limit:
                return _abort(state, judged.reason, now)
        elif judged.verdict == "Pass" and since >= pause:
            return _next(spec, state, now)
        elif judged.verdict == "Waiting" and since > pause + deadline_s:
            return _abort(state, f"too little traffic to judge it: {judged.reason} within {since:.0f}s", now)
    return Step(state, _split(spec, phase, int(state["step"])))


def seconds_to_check(spec: CanarySpec, state: Mapping[str, Any], now: float) -> float | None:
    """When to look again: the next check while one runs; None once it ended."""
    if state.get("phase") in ENDED:
        return None
    last = (state.get("evidence") or {}).get("at")
    due = (parse_rfc3339(last) if last else now) + spec.analysis.interval_s
    return max(1.0, due - now)


def check_due(spec: CanarySpec, state: Mapping[str, Any], now: float) -> bool:
    """Whether evidence should be read now (Mirroring or Weighted, an interval after the last)."""
    if state.get("phase") not in (MIRRORING, WEIGHTED):
        return False
    last = (state.get("evidence") or {}).get("at")
    return last is None or now - parse_rfc3339(last) >= spec.analysis.interval_s


def _next(spec: CanarySpec, state: dict[str, Any], now: float) -> Step:
    """The phase after this one: Mirroring (from Deploying, with a mirror), the next step, or Promoted."""
    phase, step = state["phase"], int(state.get("step") or 0)
    events: list[tuple[str, str, str]] = []
    if phase == DEPLOYING and spec.mirror_percent:
        nxt, step = MIRRORING, 0
        events.append(("Normal", "CanaryMirroring", f"copies of {spec.mirror_percent} % of live requests"))
    elif step < len(spec.steps):
        nxt, step = WEIGHTED, step + 1
        weight = spec.steps[step - 1].weight
        events.append(("Normal", "CanaryStep", f"step {step} of {len(spec.steps)}: {weight} % of requests"))
    else:
        return _promote(state, "every step passed its analysis", now, events)
    state.update(phase=nxt, step=step, stepStartedAt=rfc3339(now), failedChecks=0)
    state.pop("evidence", None)
    split = _split(spec, nxt, step)
    assert split is not None
    state.update(weight=split.weight, mirror=split.mirror)
    return Step(state, split, events)


def _promote(state: dict[str, Any], why: str, now: float, events: list[tuple[str, str, str]] | None = None) -> Step:
    state.update(phase=PROMOTED, weight=100, mirror=0, message=why[:2048], endedAt=rfc3339(now))
    return Step(state, None, [*(events or []), ("Normal", "CanaryPromoted", why)])


def _abort(state: dict[str, Any], why: str, now: float) -> Step:
    state.update(phase=ABORTED, weight=0, mirror=0, message=why[:2048], endedAt=rfc3339(now))
    return Step(state, None, [("Warning", "CanaryAborted", why)])


def _split(spec: CanarySpec, phase: str, step: int) -> Split | None:
    sticky = {"sticky_header": spec.sticky_header, "sticky_field": spec.sticky_field}
    if phase == DEPLOYING:
        return Split(0, 0, **sticky)
    if phase == MIRRORING:
        return Split(0, spec.mirror_percent, **sticky)
    if phase == WEIGHTED:
        return Split(spec.steps[step - 1].weight, 0, **sticky)
    return None


def condition(rollout: Mapping[str, Any] | None) -> Condition | None:
    """Progressing while a canary runs: where it is and what the last check said; None otherwise
    (the rollout's own condition stands)."""
    state = (rollout or {}).get("canary") or {}
    phase = state.get("phase")
    if rollout is None or rollout.get("phase") != "Progressing" or phase not in CANARY_RUNS:
        return None
    what = f"version {rollout.get('version')!r} beside {state.get('liveVersion')!r}"
    if phase == DEPLOYING:
        where = "its changed deployments are starting (no traffic yet)"
    elif phase == MIRRORING:
        where = f"copies of {state.get('mirror')} % of live requests"
    else:
        where = f"step {state.get('step')} of {state.get('steps')}: {state.get('weight')} % of requests"
    evidence = state.get("evidence") or {}
    said = f"; last check {evidence['verdict']}: {evidence.get('reason', '')}" if evidence.get("verdict") else ""
    note = f"; {state['message']}" if state.get("message") else ""
    return Condition(ConditionType.PROGRESSING, True, "Canary", f"canary of {what}: {where}{said}{note}"[:2048])
