"""What a reconcile observed → the ServeGraph's status, its conditions and its Events (pure).

The reconcile chains the `Outcome` each step returns (what fetching, validating,
the rollout and applying said) and `report` turns it, with the status already written, into the new
status, the merge patch that writes it, and the Events to post. Pure so that
every rule below (one Normal event per reconcile, Warnings only on transitions,
Ready only when every application is RUNNING) is tested by table, without a
server.

KubeRay's own Ready turns true as soon as one serve endpoint exists, even with
an application DEPLOY_FAILED; ours requires every application of the graph to
be RUNNING, which is what a user of the graph means by ready.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servegraph.names import ConditionType
from servegraph.operator import conditions
from servegraph.operator.conditions import Condition
from servegraph.operator.kuberay import (
    NO_APPLICATION,
    POD_HINT,
    RUNNING,
    blocking_problem,
    first_app_problem,
    traffic_split,
)
from servegraph.operator.values import Event, Observed

# The Warning event posted when a condition turns False, by condition type.
WARNINGS = {
    ConditionType.FETCHED: "FetchFailed",
    ConditionType.GRAPH_VALID: "InvalidGraph",
    ConditionType.APPLIED: "ApplyFailed",
}


@dataclass(frozen=True)
class Report:
    status: dict[str, Any]
    patch: dict[str, Any]
    """The merge patch from the written status to `status`; empty when there is nothing to write."""
    transitions: list[dict[str, Any]]
    """Conditions whose status, reason or message changed: one log line each."""
    events: list[Event]
    """To post once the patch is written (Warnings come only with transitions, so with a patch)."""


def report(old: Mapping[str, Any], generation: int, observed: Observed, now: str) -> Report:
    """The new status, and what to say about the change, from the status already written."""
    out = observed.outcome
    current = old.get("conditions") or []
    updates = []
    for cond, type_ in (
        (out.fetched, ConditionType.FETCHED),
        (out.valid, ConditionType.GRAPH_VALID),
        (out.applied, ConditionType.APPLIED),
        (out.progressing, ConditionType.PROGRESSING),
    ):
        if cond is not None:
            updates.append(cond)
        elif type_ in observed.still_current and (prev := conditions.get(current, type_)) is not None:
            # Still the answer for this generation: say so. Otherwise it keeps its own.
            updates.append(Condition(type_, _bool(prev["status"]), prev["reason"], prev["message"]))
    good = observed.good
    if observed.conflict is not None:
        updates.append(Condition(ConditionType.READY, False, "Conflict", observed.conflict))
    elif observed.suspended is not None:
        updates.append(observed.suspended)
    elif observed.rayservice is not None or good is None:
        updates.append(
            ready_condition(
                good.applications if good is not None else None,
                observed.applications is not None,
                observed.applications or {},
                observed.upgrade,
                observed.pending,
            )
        )
    new = dict(old)
    new["observedGeneration"] = generation
    new["conditions"] = conditions.merge(current, updates, generation, now)
    if good is not None:
        previous = old.get("graph") or {}
        new["graph"] = {
            "name": good.name,
            "version": good.version,
            "digest": f"sha256:{good.digest}",
            "shortDigest": good.digest[:12],
            "applications": len(good.applications),
            "nodes": good.node_count,
        }
        source = dict(old.get("source") or {})
        if observed.etag:
            source["etag"] = observed.etag
        if previous.get("digest") != new["graph"]["digest"] or "lastFetchTime" not in source:
            source["lastFetchTime"] = now
        new["source"] = source
    if observed.conflict is not None:  # the RayService of that name is someone else's: mirror nothing of it
        new.pop("rayServiceName", None)
        new.pop("applications", None)
        new.pop("pending", None)
    elif observed.suspended is not None:  # no RayService runs: its name stays, nothing is mirrored
        new["rayServiceName"] = observed.rayservice
        new.pop("applications", None)
    elif observed.rayservice is not None:
        new["rayServiceName"] = observed.rayservice
        new["applications"] = dict(observed.applications or {})
    if observed.upgrade:
        new["upgrade"] = dict(observed.upgrade)
    else:
        new.pop("upgrade", None)
    if observed.pending and observed.conflict is None:
        new["pending"] = dict(observed.pending)
    else:
        new.pop("pending", None)
    if observed.layout is not None:
        new["layout"] = dict(observed.layout)
    if observed.rollout is not None:
        new["rollout"] = dict(observed.rollout)
    if observed.history is not None:
        new["history"] = [dict(h) for h in observed.history]
    patch = merge_patch(old, new)
    transitions = changed_conditions(current, new["conditions"]) if patch else []
    warnings = [
        Event("Warning", WARNINGS[c["type"]], f"{c['reason']}: {c['message']}")
        for c in transitions
        if c["status"] == "False" and c["type"] in WARNINGS
    ]
    return Report(new, patch, transitions, fold_events([*out.events, *warnings]))


def changed_conditions(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Conditions of `after` that are new or differ from `before` in status, reason or message."""
    changed = []
    for cond in after:
        prev = conditions.get(before, cond["type"])
        if prev is None or (prev["status"], prev["reason"], prev["message"]) != (
            cond["status"],
            cond["reason"],
            cond["message"],
        ):
            changed.append(cond)
    return changed


def fold_events(events: list[Event]) -> list[Event]:
    """One Normal event per reconcile: "Applied" says what "Fetched" would, plus more.

    Creating a ServeGraph then costs one Event, not two: at a thousand ServeGraphs
    that is a thousand API writes saved.
    """
    normal = [e for e in events if e.type == "Normal"]
    applied = next((e for e in normal if e.reason == "Applied"), None)
    fetched = next((e for e in normal if e.reason == "Fetched"), None)
    if applied and fetched:
        normal = [Event("Normal", "Applied", f"{applied.message}: {fetched.message}")]
    return normal + [e for e in events if e.type != "Normal"]


def ready_condition(
    expected_apps: Sequence[str] | None,
    exists: bool,
    applications: Mapping[str, Any],
    upgrade: Mapping[str, Any] | None = None,
    pending: Mapping[str, Any] | None = None,
) -> Condition:
    """Ready only when every application of the graph is RUNNING; otherwise why not, the first
    blocking problem Ray or KubeRay names leading the message."""
    if expected_apps is None:
        return Condition(ConditionType.READY, False, "NoValidGraph", "no valid graph has been applied yet")
    if not exists:
        return Condition(ConditionType.READY, False, "RayServiceMissing", "the RayService does not exist yet")
    expected = list(expected_apps)
    if upgrade:
        statuses = ", ".join(f"{a}: {s}" for a, s in upgrade["applications"].items()) or "no application status yet"
        why = blocking_problem({}, pending, expected)
        split = traffic_split(upgrade)
        if split is not None:  # KubeRay 1.7's incremental upgrade: both clusters serve meanwhile
            reason = "RollbackInProgress" if upgrade.get("rollingBack") else "UpgradeInProgress"
            return Condition(ConditionType.READY, False, reason, f"{split} ({statuses})" + (f"; {why}" if why else ""))
        return Condition(
            ConditionType.READY,
            False,
            "UpgradeInProgress",
            f"KubeRay is starting Ray cluster {upgrade['pendingRayCluster'] or '(pending)'} for this version "
            f"({statuses}); {upgrade['activeRayCluster'] or 'the active cluster'} serves the previous one until then"
            + (f"; {why}" if why else ""),
        )
    missing = [a for a in expected if a not in applications]
    if len(missing) == len(expected) and pending:
        # The first cluster is starting: KubeRay reports its applications only as pending.
        starting = f"KubeRay is starting Ray cluster {pending.get('rayClusterName') or '(pending)'}"
        apps = pending.get("applications") or {}
        if apps:
            summary = _not_running(expected, apps) or "every application RUNNING; KubeRay has not switched to it yet"
            return Condition(ConditionType.READY, False, "ApplicationsNotRunning", f"{starting}: {summary}")
        return Condition(
            ConditionType.READY, False, "WaitingForApplications", f"{starting}: {NO_APPLICATION}; {POD_HINT}"
        )
    if len(missing) == len(expected):
        return Condition(
            ConditionType.READY, False, "WaitingForApplications", "KubeRay reports no application status yet"
        )
    summary = _not_running(expected, applications)
    if summary:
        return Condition(ConditionType.READY, False, "ApplicationsNotRunning", summary)
    return Condition(
        ConditionType.READY, True, "AllApplicationsRunning", f"{len(expected)} of {len(expected)} applications RUNNING"
    )


def _not_running(expected: Sequence[str], applications: Mapping[str, Any]) -> str:
    """`<first problem>; a: DEPLOYING; b: not reported`, or "" when every application runs."""
    parts = [
        f"{a}: {applications[a]['status']}"
        for a in expected
        if a in applications and applications[a]["status"] != RUNNING
    ]
    parts += [f"{a}: not reported" for a in expected if a not in applications]
    if not parts:
        return ""
    first = first_app_problem(applications, expected)
    return "; ".join([first, *parts] if first else parts)


def merge_patch(old: Any, new: Any) -> Any:
    """The RFC 7386 merge patch turning `old` into `new`; `{}` when they are equal."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif old[key] != value:
            patch[key] = (
                merge_patch(old[key], value) if isinstance(value, dict) and isinstance(old[key], dict) else value
            )
    return patch


def _bool(word: str) -> bool | None:
    return None if word == "Unknown" else word == "True"
