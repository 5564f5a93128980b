"""Rollouts: which graph version to run, when a rollout is done, when to roll back (pure).

The state lives in the ServeGraph's status (`status.rollout`, `status.history`), so
a restarted operator or a new leader continues a rollout where it was, with the same
deadline, and never retries a version it rolled back. The graphs a rollback may need
are kept in a ConfigMap owned by the ServeGraph (operator/rollout/store.py); this module only
says which digest to run and records what happened.

A rollout of version V (digest D) is:

- started when the wanted digest changes (a new download, a pin, a rollback);
- complete when KubeRay has acted on the applied RayService (its observedGeneration
  caught up), no new-cluster upgrade is pending, and every application is RUNNING;
- failed when Ray reports an application DEPLOY_FAILED or UNHEALTHY after that — at
  once if the new version was seen deploying, else once it held for STABLE_S seconds —
  or when `progressDeadline` passes first. The window matters most for a rollback:
  right after the good version is pushed again, KubeRay still shows the bad version's
  DEPLOY_FAILED.

A failed rollout rolls back (autoRollback, the default) to the last version that was
Ready, if its graph is kept; D is then refused until the source serves something
else (or someone pins it). A rollback that fails itself stops there: no loops.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servegraph.names import ConditionType
from servegraph.operator.conditions import Condition, parse_rfc3339, rfc3339
from servegraph.operator.kuberay import DEPLOYING_APP_STATES, FAILED_APP_STATES, RUNNING, traffic_split
from servegraph.operator.rollout.canary import CANARY_RUNS, Gate
from servegraph.operator.spec import RolloutSpec

PROGRESSING, SERVING, SUPERSEDED, FAILED, ROLLED_BACK = "Progressing", "Serving", "Superseded", "Failed", "RolledBack"
APP_FAILED = "ApplicationFailed"
MAX_MESSAGE = 1024
# How long every application must stay RUNNING, after KubeRay acted on the new spec,
# before a rollout is complete. KubeRay writes the statuses it read right after pushing
# a config, before Ray Serve has started on it: "RUNNING" then is still the old version's.
# KubeRay reads them again every 2 s, so within this window a new version shows DEPLOYING.
STABLE_S = 15.0


@dataclass(frozen=True)
class Candidate:
    """A valid graph the operator could run."""

    digest: str
    version: str
    source: str = ""


@dataclass(frozen=True)
class Health:
    """What the live RayService says about the applied version."""

    settled: bool
    """KubeRay has acted on the spec last applied (its observedGeneration caught up)."""
    applications: Mapping[str, Any]
    """Mirrored application statuses of the active cluster (kuberay.mirror_applications)."""
    upgrade: Mapping[str, Any] | None = None
    """A new-cluster upgrade in progress (kuberay.mirror_upgrade)."""
    expected: tuple[str, ...] = ()
    """The applications of the applied version."""
    blocker: str | None = None
    """The first blocking problem KubeRay or Ray Serve names (kuberay.blocking_problem), if any."""


@dataclass
class Decision:
    target: str | None
    """The digest to render and apply; None: nothing to run yet."""
    rollout: dict[str, Any] | None
    history: list[dict[str, Any]]
    progressing: Condition | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)
    """(type, reason, message) to post."""
    outcome: str | None = None
    """Set on the reconcile that finished a rollout: Serving, Failed, RolledBack or Superseded."""

    def seconds_to_deadline(self, now: float) -> float | None:
        """When to look again if nothing else happens: when a stable window or the deadline ends."""
        if self.rollout is None or self.rollout.get("phase") != PROGRESSING:
            return None
        due = parse_rfc3339(self.rollout["deadline"])
        for since in ("runningSince", "failingSince"):
            if since in self.rollout:
                due = min(due, parse_rfc3339(self.rollout[since]) + STABLE_S)
        return max(0.0, due - now) + 1.0


def decide(
    spec: RolloutSpec,
    candidate: Candidate | None,
    status: Mapping[str, Any],
    kept: Sequence[str],
    health: Health | None,
    now: float,
    gate: Gate | None = None,
) -> Decision:
    """The next state of the rollout, from the last one and what was observed.

    `status` is the ServeGraph's current status (its `rollout` and `history`); `kept`
    the digests whose graphs the store holds; `health` None when the RayService does
    not exist (yet).
    """
    history = [dict(h) for h in status.get("history") or []]
    rollout = dict(status["rollout"]) if status.get("rollout") else None
    d = Decision(target=rollout["digest"] if rollout else None, rollout=rollout, history=history)

    wanted, why = _wanted(spec, candidate, history, rollout)
    if wanted is None:
        if why:
            d.progressing = Condition(ConditionType.PROGRESSING, False, "PinUnavailable", why)
        return _trim(d, spec)
    if rollout is None or rollout["digest"] != wanted.digest:
        _start(d, spec, wanted, now, cause=why)
        return _trim(d, spec)

    if rollout["phase"] != PROGRESSING:
        d.progressing = _settled_condition(rollout)
        return _trim(d, spec)
    gate = gate or Gate()
    if gate.hold:  # the deadline counts from the canary's end: it slides while the canary runs
        rollout["deadline"] = rfc3339(max(parse_rfc3339(rollout["deadline"]), now + spec.progress_deadline_s))
    failure = gate.fail or (None if gate.hold else _failure(rollout, health, now))
    # A failure or a success counts once it has held for STABLE_S: either may still be
    # the previous version's status. A failure after the new version was seen deploying
    # is its own, and counts at once (a single replica fails every request meanwhile).
    app_failed = failure is not None and failure[0] == APP_FAILED
    if _deploying(health):
        rollout["deploySeen"] = True  # statuses are the new version's from here on
    if app_failed and not _held(rollout, "failingSince", True, now) and not rollout.get("deploySeen"):
        failure = None
    if failure is None:
        _held(rollout, "failingSince", app_failed, now)
        if _held(rollout, "runningSince", not app_failed and not gate.hold and _complete(health), now):
            _finish(d, now)
        elif rollout.get("cause") == "rollback":
            d.progressing = Condition(
                ConditionType.PROGRESSING,
                True,
                "RollingBack",
                f"rolling back to version {rollout['version']!r} ({_short(wanted.digest)}) "
                f"after {_short(rollout.get('from', ''))} failed" + _waiting_on(health),
            )
        else:
            d.progressing = Condition(
                ConditionType.PROGRESSING,
                True,
                "RollingOut",
                f"rolling out version {rollout['version']!r} ({_short(wanted.digest)})" + _waiting_on(health),
            )
        return _trim(d, spec)
    _fail(d, spec, failure, kept, now)
    return _trim(d, spec)


def _wanted(
    spec: RolloutSpec, candidate: Candidate | None, history: list[dict[str, Any]], rollout: Mapping[str, Any] | None
) -> tuple[Candidate | None, str]:
    """(what should run, why) — a pin wins, then the source, unless the source's digest was rolled back."""
    if spec.pin_digest or spec.pin_version:
        for entry in history:
            if entry["digest"] == spec.pin_digest or (spec.pin_version and entry["version"] == spec.pin_version):
                return Candidate(entry["digest"], entry["version"], entry.get("source", "")), "pinned"
        if candidate is not None and candidate.digest == spec.pin_digest:
            return candidate, "pinned"
        what = spec.pin_digest or f"version {spec.pin_version!r}"
        return None, f"pinned {what} is neither served by the source nor kept in the history"
    if candidate is None:
        return None, ""
    running = _queued_behind(spec, rollout)
    if running is not None and candidate.digest != running["digest"]:
        # onPublish: Queue — the running canary ends first; the newest version waits its turn.
        return Candidate(running["digest"], running["version"], running.get("source", "")), "source"
    if rollout is not None and rollout.get("cause") == "rollback" and candidate.digest == rollout.get("from"):
        return Candidate(rollout["digest"], rollout["version"], rollout.get("source", "")), "rollback"
    if any(h["digest"] == candidate.digest and h["outcome"] == ROLLED_BACK for h in history):
        previous = rollout and Candidate(rollout["digest"], rollout["version"], rollout.get("source", ""))
        return previous or None, "refused"
    return candidate, "source"


def _queued_behind(spec: RolloutSpec, rollout: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The rollout of a running canary that queues publishes (onPublish: Queue), else None."""
    if spec.canary is None or not spec.canary.queue_publishes or rollout is None:
        return None
    running = rollout.get("phase") == PROGRESSING and (rollout.get("canary") or {}).get("phase") in CANARY_RUNS
    return rollout if running else None


def _start(d: Decision, spec: RolloutSpec, wanted: Candidate, now: float, cause: str) -> None:
    previous = d.rollout
    d.rollout = {
        "digest": wanted.digest,
        "version": wanted.version,
        "source": wanted.source,
        "phase": PROGRESSING,
        "cause": "pin" if cause == "pinned" else "source",
        "startedAt": rfc3339(now),
        "deadline": rfc3339(now + spec.progress_deadline_s),
    }
    if previous is not None:
        d.rollout["previous"] = previous["digest"] if previous.get("phase") == SERVING else previous.get("previous", "")
    d.target = wanted.digest
    for entry in d.history:
        if entry["outcome"] == PROGRESSING:  # replaced before it was Ready
            entry["outcome"] = SUPERSEDED
            entry["message"] = f"superseded by version {wanted.version!r} before it was Ready"
            d.outcome = d.outcome or SUPERSEDED
    d.history.insert(
        0,
        {
            "version": wanted.version,
            "digest": wanted.digest,
            "source": wanted.source,
            "appliedAt": rfc3339(now),
            "outcome": PROGRESSING,
        },
    )
    what = f"rolling out version {wanted.version!r} ({_short(wanted.digest)})"
    d.progressing = Condition(ConditionType.PROGRESSING, True, "RollingOut", what)


def _failure(rollout: Mapping[str, Any], health: Health | None, now: float) -> tuple[str, str] | None:
    """(reason, message) when the rollout failed."""
    if health is not None and health.settled:
        failed = [
            (name, app) for name, app in sorted(health.applications.items()) if app.get("status") in FAILED_APP_STATES
        ]
        failed += [
            (name, {"status": status})
            for name, status in sorted(((health.upgrade or {}).get("applications") or {}).items())
            if status in FAILED_APP_STATES
        ]
        if failed:
            parts = []
            for name, app in failed:
                text = f"{name}: {app.get('status')}"
                if app.get("message"):
                    text += f": {app['message']}"
                parts.append(text)
            return APP_FAILED, "; ".join(parts)[:MAX_MESSAGE]
    if now > parse_rfc3339(rollout["deadline"]):
        why = f"not Ready within the progress deadline ({rollout['deadline']})"
        return "ProgressDeadlineExceeded", why + _waiting_on(health)
    return None


def _waiting_on(health: Health | None) -> str:
    """`; <an incremental upgrade's split>; <the first blocking problem>`, what KubeRay or Ray Serve says."""
    said = [] if health is None else [traffic_split(health.upgrade), health.blocker]
    return "".join(f"; {part}" for part in said if part)


def _held(rollout: dict[str, Any], since: str, true: bool, now: float) -> bool:
    """Track in `rollout[since]` when a fact became true; whether it has held for STABLE_S."""
    if not true:
        rollout.pop(since, None)
        return False
    rollout.setdefault(since, rfc3339(now))
    return now - parse_rfc3339(rollout[since]) >= STABLE_S


def _deploying(health: Health | None) -> bool:
    if health is None or not health.settled:
        return False
    return any(health.applications.get(a, {}).get("status") in DEPLOYING_APP_STATES for a in health.expected)


def _complete(health: Health | None) -> bool:
    if health is None or not health.settled or health.upgrade:
        return False
    apps = health.applications
    return bool(health.expected) and all(apps.get(a, {}).get("status") == RUNNING for a in health.expected)


def _finish(d: Decision, now: float) -> None:
    assert d.rollout is not None
    d.rollout["phase"] = SERVING
    d.rollout["readyAt"] = rfc3339(now)
    d.rollout.pop("runningSince", None)
    d.rollout.pop("failingSince", None)
    d.rollout.pop("deploySeen", None)
    for entry in d.history:
        if entry["digest"] == d.rollout["digest"] and entry["outcome"] == PROGRESSING:
            entry["outcome"], entry["readyAt"] = SERVING, rfc3339(now)
            break
    for entry in d.history:
        if entry["outcome"] == SERVING and entry.get("readyAt") != rfc3339(now):
            entry["outcome"] = SUPERSEDED
    d.outcome = SERVING
    d.progressing = _settled_condition(d.rollout)
    d.events.append(("Normal", "RolloutComplete", f"version {d.rollout['version']!r} is Ready"))


def _fail(d: Decision, spec: RolloutSpec, failure: tuple[str, str], kept: Sequence[str], now: float) -> None:
    assert d.rollout is not None
    reason, message = failure
    bad = d.rollout
    last_good = _last_ready(d.history, exclude=bad["digest"])
    can_roll_back = spec.auto_rollback and bad.get("cause") != "rollback" and not (spec.pin_digest or spec.pin_version)
    if can_roll_back and last_good is not None and last_good["digest"] in kept:
        _mark(d.history, bad["digest"], ROLLED_BACK, f"{reason}: {message}")
        d.outcome = ROLLED_BACK
        d.events.append(
            (
                "Warning",
                "RolledBack",
                f"version {bad['version']!r} failed ({reason}: {message}); "
                f"rolling back to version {last_good['version']!r}",
            )
        )
        _start(d, spec, Candidate(last_good["digest"], last_good["version"], last_good.get("source", "")), now, "")
        d.rollout["cause"], d.rollout["from"] = "rollback", bad["digest"]
        d.progressing = Condition(
            ConditionType.PROGRESSING,
            False,
            "RolledBack",
            f"version {bad['version']!r} failed ({reason}: {message}); rolled back to version {last_good['version']!r}",
        )
        return
    why = _no_rollback_reason(spec, bad, last_good, kept)
    _mark(d.history, bad["digest"], FAILED, f"{reason}: {message}")
    bad["phase"] = FAILED
    bad.pop("failingSince", None)
    bad.pop("deploySeen", None)
    bad["message"] = f"{reason}: {message}"[:MAX_MESSAGE]
    d.outcome = FAILED
    d.events.append(("Warning", "RolloutFailed", f"version {bad['version']!r} failed ({reason}: {message}); {why}"))
    d.progressing = Condition(ConditionType.PROGRESSING, False, reason, f"{message}; {why}"[:MAX_MESSAGE])


def _no_rollback_reason(
    spec: RolloutSpec, bad: Mapping[str, Any], last_good: Mapping[str, Any] | None, kept: Sequence[str]
) -> str:
    if not spec.auto_rollback:
        return "autoRollback is off: it stays applied"
    if spec.pin_digest or spec.pin_version:
        return "the version is pinned: it stays applied"
    if bad.get("cause") == "rollback":
        return "this was a rollback already: no further rollback"
    if last_good is None:
        return "no earlier version was Ready: nothing to roll back to"
    return f"version {last_good['version']!r} is not kept (too large to store): rollback unavailable"


def _settled_condition(rollout: Mapping[str, Any]) -> Condition:
    if rollout["phase"] == SERVING:
        if rollout.get("cause") == "rollback":
            return Condition(
                ConditionType.PROGRESSING,
                False,
                "RolledBack",
                f"rolled back to version {rollout['version']!r} ({_short(rollout['digest'])}), which is Ready",
            )
        return Condition(ConditionType.PROGRESSING, True, "Complete", f"version {rollout['version']!r} is Ready")
    return Condition(ConditionType.PROGRESSING, False, rollout.get("phase", FAILED), rollout.get("message", ""))


def _last_ready(history: list[dict[str, Any]], exclude: str) -> dict[str, Any] | None:
    for entry in history:
        if entry["digest"] != exclude and entry.get("readyAt") and entry["outcome"] in (SERVING, SUPERSEDED):
            return entry
    return None


def _mark(history: list[dict[str, Any]], digest: str, outcome: str, message: str) -> None:
    for entry in history:
        if entry["digest"] == digest and entry["outcome"] == PROGRESSING:
            entry["outcome"], entry["message"] = outcome, message[:MAX_MESSAGE]
            return


def _trim(d: Decision, spec: RolloutSpec) -> Decision:
    """Keep `historyLimit` entries, but never drop the last Ready one (the rollback target)."""
    if len(d.history) > spec.history_limit:
        keep = d.history[: spec.history_limit]
        ready = _last_ready(d.history, exclude="")
        if ready is not None and ready not in keep:
            keep[-1] = ready
        d.history = keep
    return d


def kept_digests(history: Sequence[Mapping[str, Any]]) -> list[str]:
    """The digests whose graphs the store should hold: every version in the history."""
    return list(dict.fromkeys(h["digest"] for h in history))


def _short(digest: str) -> str:
    return digest[:12]
