"""Suspend and resume (`spec.suspend`): the Ray cluster removed, the ServeGraph and its graphs kept.

Where the installed KubeRay has a suspend of its own (RayService `spec.suspend`, KubeRay 1.7,
found in its CRD at start: render/kuberay_features.py), the RayService is kept and rendered
with `suspend: true`: KubeRay deletes its Ray clusters and everything it made for them
(Services, the incremental upgrade's Gateway and HTTPRoute), says `Suspending`, then
`Suspended`, and on resume starts a new cluster from the same RayService. Earlier KubeRay has
none (the RayCluster's `suspend` would leave the RayService pushing its Serve config to a
cluster without pods), so there the RayService is deleted: KubeRay's finalizer removes its Ray
clusters, and the pods go with them. Either way everything the ServeGraph holds stays: the
status (graph version, rollout, history) and the graphs kept for rollback
(operator/rollout/store.py). Resuming renders the version of `status.rollout` again, from memory
or the store. This module decides (pure); the write is the apply stage's (deploying.py renders
and applies the suspended RayService, apply/removal.py deletes one).

While suspended nothing is downloaded: polls are held (the next one is due a whole interval
after the resume) and a refresh waits (the resume's first reconcile sees a new value and
downloads). A rollout in progress stops its clock: `suspendedAt` is recorded, and on resume
its deadline moves on by the time suspended, so a version is not failed for the minutes its
cluster did not exist.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from servegraph.names import ConditionType
from servegraph.operator.cache import FetchState
from servegraph.operator.conditions import Condition, parse_rfc3339, rfc3339
from servegraph.operator.kuberay import Live
from servegraph.operator.rollout.decide import PROGRESSING
from servegraph.operator.spec import Source
from servegraph.operator.values import Event, Observed, Outcome

SUSPENDED = "Suspended"
SUSPENDED_AT = "suspendedAt"


def hold_polls(fetch: FetchState, source: Source, now: float) -> FetchState:
    """No poll while suspended, nor at once on resume: the next is due an interval from now."""
    if not source.poll_interval_s:
        return fetch
    return replace(fetch, poll_due=max(fetch.poll_due, now + source.poll_interval_s))


def pause(rollout: Mapping[str, Any] | None, now: float) -> dict[str, Any] | None:
    """status.rollout while suspended: one in progress records when its clock stopped."""
    if rollout is None:
        return None
    out = dict(rollout)
    if out.get("phase") == PROGRESSING:
        out.setdefault(SUSPENDED_AT, rfc3339(now))
    return out


def resume(status: Mapping[str, Any], now: float) -> Mapping[str, Any]:
    """The status with its rollout's clock running again: the deadline later by the time
    suspended, and the stable-window marks dropped (the new cluster reports from scratch)."""
    rollout = status.get("rollout") or {}
    if SUSPENDED_AT not in rollout:
        return status
    moved = dict(rollout)
    paused_for = max(0.0, now - parse_rfc3339(moved.pop(SUSPENDED_AT)))
    if "deadline" in moved:
        moved["deadline"] = rfc3339(parse_rfc3339(moved["deadline"]) + paused_for)
    for mark in ("runningSince", "failingSince", "deploySeen"):
        moved.pop(mark, None)
    return {**status, "rollout": moved}


def report(
    out: Outcome,
    status: Mapping[str, Any],
    rs_name: str,
    live: Live | None,
    acted: bool,
    conflict: str | None,
    still_current: frozenset[str],
    now: float,
    in_kuberay: bool = False,
) -> Observed:
    """What a suspended ServeGraph's status says: Ready and Progressing False `Suspended`, the
    kept version named; Applied says where KubeRay's suspend (`in_kuberay`) or the RayService's
    deletion is. `acted`: this reconcile set the RayService's spec.suspend, or deleted it."""
    rollout = status.get("rollout") or {}
    version = rollout.get("version") or (status.get("graph") or {}).get("version")
    kept = f"version {version!r} is kept and runs again" if version else "the graph is downloaded and run"
    if conflict is None and (out.applied is None or (in_kuberay and out.applied.status)):
        if in_kuberay and live is not None and not live.deleting:
            done = live.suspended == SUSPENDED and not acted
            what = f"RayService {rs_name} has spec.suspend: KubeRay " + (
                "deleted its Ray cluster (Suspended)" if done else "deletes its Ray cluster (Suspending)"
            )
        elif acted or (live is not None and live.deleting):
            what = f"RayService {rs_name} is being deleted: KubeRay removes its Ray cluster"
        else:
            what = f"RayService {rs_name} is deleted: no Ray cluster runs"
        out = out.then(Outcome(applied=Condition(ConditionType.APPLIED, True, SUSPENDED, what)))
    if acted:
        did = f"set spec.suspend on RayService {rs_name}" if in_kuberay else f"deleted RayService {rs_name}"
        said = f"{did} (spec.suspend); {kept} on resume"
        out = out.then(Outcome(events=(Event("Normal", SUSPENDED, said),)))
    waiting = "suspended: downloads, rollouts and their deadlines wait for spec.suspend: false"
    out = out.then(Outcome(progressing=Condition(ConditionType.PROGRESSING, False, SUSPENDED, waiting)))
    ready = Condition(ConditionType.READY, False, SUSPENDED, f"spec.suspend is true: {kept} when it is false")
    return Observed(
        outcome=out,
        good=None,
        etag=None,
        rayservice=rs_name,
        applications=None,
        rollout=pause(status.get("rollout"), now),
        conflict=conflict,
        still_current=still_current,
        suspended=ready,
    )
