"""Suspend and resume (`spec.suspend`): the Ray cluster removed, the ServeGraph and its graphs kept.

KubeRay v1.6.2's RayService has no suspend of its own (its CRD has none; the RayCluster's
`suspend` would leave the RayService pushing its Serve config to a cluster without pods),
so a suspended ServeGraph's RayService is deleted: KubeRay's finalizer removes its Ray
clusters, and the pods go with them. Everything the ServeGraph holds stays: the status
(graph version, rollout, history) and the graphs kept for rollback (operator/rollout/store.py).
Resuming renders the version of `status.rollout` again, from memory or the store.

While suspended nothing is downloaded: polls are held (the next one is due a whole interval
after the resume) and a refresh waits (the resume's first reconcile sees a new value and
downloads). A rollout in progress stops its clock: `suspendedAt` is recorded, and on resume
its deadline moves on by the time suspended, so a version is not failed for the minutes its
cluster did not exist.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from servegraph.kube import KubeError
from servegraph.names import ConditionType, Key
from servegraph.operator.apply.drift import Live
from servegraph.operator.apply.ownership import NotOurs, delete_owned
from servegraph.operator.cache import FetchState, WatchCache
from servegraph.operator.protocols import ApiServer
from servegraph.operator.rollout.decide import PROGRESSING, parse_rfc3339, rfc3339
from servegraph.operator.spec import Source
from servegraph.operator.status.conditions import Condition
from servegraph.operator.status.report import Event, Observed, Outcome

log = logging.getLogger("servegraph.operator")

SUSPENDED = "Suspended"
SUSPENDED_AT = "suspendedAt"
DELETE_ATTEMPTS = 2
"""Deletes per reconcile when the RayService changed between the read and the delete."""


def hold_polls(fetch: FetchState, source: Source, now: float) -> None:
    """No poll while suspended, nor at once on resume: the next is due an interval from now."""
    if source.poll_interval_s:
        fetch.poll_due = max(fetch.poll_due, now + source.poll_interval_s)


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


async def remove(
    api: ApiServer, cache: WatchCache, key: Key, name: str, body: Mapping[str, Any], live: Live | None
) -> tuple[bool, Outcome]:
    """Delete the ServeGraph's RayService unless it is gone or going: whether a delete was sent,
    and a failure said in Applied, to be retried."""
    if live is None or live.deleting:
        return False, Outcome()
    for attempt in range(DELETE_ATTEMPTS):
        try:
            deleted = await delete_owned(api, key[0], name, body["metadata"]["uid"])
        except NotOurs as exc:
            failed = Condition(ConditionType.APPLIED, False, "Conflict", exc.reason)
        except KubeError as exc:
            if exc.status == 409 and attempt + 1 < DELETE_ATTEMPTS:
                continue  # changed since it was read (KubeRay's status): read it again, decide again
            reason = "Conflict" if exc.status == 409 else "DeleteFailed"
            failed = Condition(ConditionType.APPLIED, False, reason, str(exc))
        else:
            if deleted:
                cache.put_rayservice((key[0], name), replace(live, deleting=True))  # the watch will say so too
                log.info("[%s/%s] suspended: deleted RayService %s", *key, name)
            return deleted, Outcome()
        break
    return False, Outcome(applied=failed, retry=True)


def report(
    out: Outcome,
    status: Mapping[str, Any],
    rs_name: str,
    live: Live | None,
    deleted: bool,
    conflict: str | None,
    still_current: frozenset[str],
    now: float,
) -> Observed:
    """What a suspended ServeGraph's status says: Ready and Progressing False `Suspended`, the
    kept version named; Applied says where the RayService's deletion is."""
    rollout = status.get("rollout") or {}
    version = rollout.get("version") or (status.get("graph") or {}).get("version")
    kept = f"version {version!r} is kept and runs again" if version else "the graph is downloaded and run"
    if out.applied is None and conflict is None:
        if deleted or (live is not None and live.deleting):
            what = f"RayService {rs_name} is being deleted: KubeRay removes its Ray cluster"
        else:
            what = f"RayService {rs_name} is deleted: no Ray cluster runs"
        out = out.then(Outcome(applied=Condition(ConditionType.APPLIED, True, SUSPENDED, what)))
    if deleted:
        said = f"deleted RayService {rs_name} (spec.suspend); {kept} on resume"
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
