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
from dataclasses import dataclass, field
from typing import Any

from servegraph.dag.model import Graph
from servegraph.names import ConditionType
from servegraph.operator.packed import pack_bytes, unpack_bytes
from servegraph.operator.rollout.blockers import (
    NO_APPLICATION,
    POD_HINT,
    blocking_problem,
    first_app_problem,
    mirror_apps,
)
from servegraph.operator.status import conditions
from servegraph.operator.status.conditions import Condition

RUNNING = "RUNNING"
# The Warning event posted when a condition turns False, by condition type.
WARNINGS = {
    ConditionType.FETCHED: "FetchFailed",
    ConditionType.GRAPH_VALID: "InvalidGraph",
    ConditionType.APPLIED: "ApplyFailed",
}


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Outcome:
    """What a reconcile step found, before it becomes status and events.

    Each step (download, ownership, rollout, render, apply, suspension) returns its
    own; the reconcile chains them with `then` and stops when one says `retry`. A
    condition left None keeps its previous value (that step did not run or did not say).
    """

    fetched: Condition | None = None
    valid: Condition | None = None
    applied: Condition | None = None
    events: tuple[Event, ...] = ()
    retry: bool = False
    progressing: Condition | None = None

    def then(self, later: Outcome) -> Outcome:
        """Both steps' findings: the later step's conditions win, events add up, either may ask to retry."""
        return Outcome(
            _latest(self.fetched, later.fetched),
            _latest(self.valid, later.valid),
            _latest(self.applied, later.applied),
            self.events + later.events,
            self.retry or later.retry,
            _latest(self.progressing, later.progressing),
        )


def _latest(earlier: Condition | None, later: Condition | None) -> Condition | None:
    return earlier if later is None else later


@dataclass(frozen=True)
class GoodGraph:
    """A valid graph (the last downloaded, or a kept one): what the status and the rollout
    read of it, and its bytes packed to parse again when it must be rendered.

    Not the parsed model: a typical tenant's graph (~56 nodes) is ~20 KiB parsed and ~1 KiB
    packed, so at 10,000 ServeGraphs keeping the model cost ~200 MiB for what a steady
    cluster never reads. The renderer asks `rendering.parsed`, which takes it from the
    recently parsed graphs (`WatchCache.graph`) or parses the packed bytes again."""

    digest: str
    name: str
    version: str
    applications: tuple[str, ...]
    node_count: int
    packed: bytes = field(repr=False)

    @classmethod
    def of(cls, graph: Graph, digest: str, data: bytes) -> GoodGraph:
        """`data` are the graph's bytes as downloaded (or kept), `graph` what they parse to."""
        names = tuple(a.name for a in graph.applications)
        return cls(digest, graph.name, graph.version, names, graph.node_count, pack_bytes(data))

    def data(self) -> bytes:
        return unpack_bytes(self.packed)


@dataclass(frozen=True)
class Observed:
    """Everything `report` reads, gathered by the reconcile."""

    outcome: Outcome
    good: GoodGraph | None
    etag: str | None
    rayservice: str | None
    """The RayService's name once one is desired; None before (no valid graph, or an invalid spec)."""
    applications: Mapping[str, Any] | None
    """Mirrored application statuses of the live RayService; None when it does not exist."""
    upgrade: Mapping[str, Any] | None = None
    """KubeRay's new-cluster upgrade in progress (mirror_upgrade), or None."""
    pending: Mapping[str, Any] | None = None
    """The Ray cluster KubeRay is starting and its applications (blockers.mirror_pending), or None."""
    rollout: Mapping[str, Any] | None = None
    """status.rollout as rollout.decide left it (None: no rollout yet, leave it out)."""
    history: list[dict[str, Any]] | None = None
    conflict: str | None = None
    """Why the RayService of that name is not this ServeGraph's to write (drift.conflict), or None."""
    still_current: frozenset[str] = frozenset(
        {ConditionType.FETCHED, ConditionType.GRAPH_VALID, ConditionType.APPLIED, ConditionType.PROGRESSING}
    )
    """The conditions this reconcile did not recompute that still answer for this generation:
    the source they were computed for is the one the spec names now. The others (a new URL,
    pin or token whose download failed or has not run yet, an invalid spec) keep the
    generation they were computed for, so an old success never reads as the new spec's."""
    suspended: Condition | None = None
    """The Ready condition of a suspended ServeGraph (operator/rollout/suspension.py): no RayService
    runs, so none is mirrored; None otherwise."""


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


def mirror_upgrade(rayservice: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """KubeRay's new-cluster upgrade in progress, or None.

    While KubeRay builds a pending cluster for a changed cluster spec, the active one
    keeps serving the previous version: the status must say so, not Ready.
    """
    status = (rayservice or {}).get("status") or {}
    pending = status.get("pendingServiceStatus") or {}
    upgrading = any(
        c.get("type") == "UpgradeInProgress" and c.get("status") == "True" for c in status.get("conditions") or []
    )
    active = (status.get("activeServiceStatus") or {}).get("rayClusterName")
    # A pending cluster without an active one is the first cluster starting, not an upgrade.
    if not upgrading and not (pending.get("rayClusterName") and active):
        return None
    apps = pending.get("applicationStatuses") or {}
    out: dict[str, Any] = {
        "activeRayCluster": active or "",
        "pendingRayCluster": pending.get("rayClusterName", ""),
        "applications": {name: (apps[name] or {}).get("status", "") for name in sorted(apps)},
    }
    return out


def mirror_applications(rayservice: Mapping[str, Any] | None) -> dict[str, Any]:
    """Per-application and per-deployment statuses of the active cluster (messages bounded)."""
    if not rayservice:
        return {}
    active = (rayservice.get("status") or {}).get("activeServiceStatus") or {}
    return mirror_apps(active.get("applicationStatuses"))


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
