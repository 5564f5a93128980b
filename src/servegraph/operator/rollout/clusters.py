"""The Ray cluster KubeRay starts for a version, recorded on its history entry (pure).

A version that changes the cluster (its image, its worker groups) runs on a new Ray cluster
KubeRay starts beside the serving one. With KubeRay 1.7's incremental upgrade that new
cluster serves a growing share of the requests before it takes over; when the spec goes back
meanwhile — servegraph rolls a failed version back, or an earlier version is published or
pinned again — KubeRay moves the requests back (its RollbackInProgress condition) and deletes
the new cluster, which then never served them all. A new cluster that never got a request
goes in the same status write that starts its rollback, so the condition may never be seen:
a cluster that leaves without having taken over is rolled back too. The upgrade itself is
mirrored only while it lasts (`status.upgrade`, operator/kuberay.py); what stays is on the
version's entry of `status.history`, `rayCluster`:

- `name`: the cluster KubeRay started for it (named once KubeRay has acted on its spec);
- `outcome`: `Starting`, then `Promoted` (it took over) or `RolledBack` (deleted before);
- `peakTrafficPercent`: the largest share of the requests it had (incremental upgrades);
- `rolledBackAt`: when its rollback was seen, said once by a `ClusterRolledBack` Event.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from servegraph.operator.conditions import rfc3339
from servegraph.operator.rollout.decide import Decision

CLUSTER = "rayCluster"
STARTING, PROMOTED, ROLLED_BACK = "Starting", "Promoted", "RolledBack"
ROLLED_BACK_EVENT = "ClusterRolledBack"


def note(decision: Decision, upgrade: Mapping[str, Any] | None, active: str, settled: bool, now: float) -> Decision:
    """The decision with the new cluster KubeRay is starting, or has promoted or dropped,
    recorded on its version's history entry (a new Decision; the same one when nothing changes).
    `upgrade` is `status.upgrade` as mirrored, `active` the cluster serving."""
    if not decision.history:
        return decision
    history = [{**h, CLUSTER: dict(h[CLUSTER])} if CLUSTER in h else dict(h) for h in decision.history]
    events = list(decision.events)
    pending = str((upgrade or {}).get("pendingRayCluster") or "")
    if pending:
        entry = next((h for h in history if h.get(CLUSTER, {}).get("name") == pending), None)
        if entry is None:
            entry = _owner(history, decision.rollout, bool((upgrade or {}).get("rollingBack")), settled)
            if entry is not None:
                entry[CLUSTER] = {"name": pending, "outcome": STARTING}
        if entry is not None:
            cluster = entry[CLUSTER]
            incremental = (upgrade or {}).get("incremental") or {}
            routed = (incremental.get("pending") or {}).get("trafficRoutedPercent")
            if isinstance(routed, int) and routed > int(cluster.get("peakTrafficPercent", 0)):
                cluster["peakTrafficPercent"] = routed
            if (upgrade or {}).get("rollingBack") and cluster["outcome"] == STARTING:
                events.append(_rolled_back(entry, cluster, active, now))
    for entry in history:
        cluster = entry.get(CLUSTER)
        if cluster is None or cluster["outcome"] != STARTING or cluster["name"] == pending:
            continue
        if cluster["name"] == active:
            cluster["outcome"] = PROMOTED
        elif active and settled:  # gone without taking over: the spec went back, or on
            events.append(_rolled_back(entry, cluster, active, now))
    if history == decision.history:
        return decision
    return replace(decision, history=history, events=events)


def _rolled_back(entry: Mapping[str, Any], cluster: dict[str, Any], active: str, now: float) -> tuple[str, str, str]:
    cluster["outcome"], cluster["rolledBackAt"] = ROLLED_BACK, rfc3339(now)
    peak = cluster.get("peakTrafficPercent")
    most = f"{peak} % of the requests at most" if peak else "no request"
    return (
        "Normal",
        ROLLED_BACK_EVENT,
        f"KubeRay rolls back Ray cluster {cluster['name']} of version {entry['version']!r} ({most}): "
        f"{active or 'the active cluster'} serves, as the spec applied now asks",
    )


def _owner(
    history: list[dict[str, Any]], rollout: Mapping[str, Any] | None, rolling_back: bool, settled: bool
) -> dict[str, Any] | None:
    """The entry a pending cluster seen for the first time belongs to: the version applied now,
    once KubeRay has acted on it (a version restarted gets its new cluster); one already rolling
    back, the newest other version without a cluster (the operator did not see it start)."""
    current = (rollout or {}).get("digest")
    if rolling_back:
        return next((h for h in history if h["digest"] != current and CLUSTER not in h), None)
    if not settled or history[0]["digest"] != current:
        return None
    # Another cluster for a version that took one over already: a restart (the newest counts).
    return history[0] if history[0].get(CLUSTER, {}).get("outcome", PROMOTED) == PROMOTED else None
