"""The Ray cluster KubeRay starts for a version, on its history entry (operator/rollout/clusters.py),
through the rollout's decisions as the reconcile makes them (rollout/step.py: decide, then note):
an incremental upgrade whose new cluster fails, is rolled back by servegraph (the spec goes
back), and KubeRay then moves the requests back (RollbackInProgress) and deletes it."""

from __future__ import annotations

from typing import Any

from test_rollout import RUNNING, STABLE_S, T0, V1, V2, apply, serving, step

from servegraph.operator.conditions import rfc3339
from servegraph.operator.rollout.clusters import note
from servegraph.operator.rollout.decide import PROGRESSING, ROLLED_BACK, SERVING, Decision, Health


def upgrade(routed: int | None, *, apps: str = "RUNNING", rolling_back: bool = False) -> dict[str, Any]:
    """status.upgrade as operator/kuberay.py mirrors an incremental upgrade from mini-a to mini-b."""
    pending: dict[str, Any] = {} if routed is None else {"trafficRoutedPercent": routed, "targetCapacity": 50}
    active = {} if routed is None else {"trafficRoutedPercent": 100 - routed, "targetCapacity": 100}
    out: dict[str, Any] = {
        "activeRayCluster": "mini-a",
        "pendingRayCluster": "mini-b",
        "applications": {"app": apps},
        "incremental": {"active": active, "pending": pending},
    }
    if rolling_back:
        out["rollingBack"] = True
    return out


def observe(
    status: dict[str, Any], seen: dict[str, Any] | None, at: float, settled: bool = True, active: str = "mini-a"
) -> Decision:
    """One reconcile: decide, then record the upgrade seen (rollout/step.py's order)."""
    health = Health(settled, {"app": {"status": "RUNNING"}}, seen, ("app",))
    return note(step(status, V2, health, at), seen, active, settled, at)


def rolling_out_v2() -> dict[str, Any]:
    """v1 Ready on mini-a; v2 applied, and KubeRay starting mini-b for it (recorded)."""
    status = apply(serving(), step(serving(), V2, RUNNING, T0 + 40))
    before = observe(status, upgrade(None), T0 + 41, settled=False)
    assert "rayCluster" not in before.history[0], "named only once KubeRay has acted on the new spec"
    status = apply(status, observe(status, upgrade(None), T0 + 42))
    assert status["history"][0]["rayCluster"] == {"name": "mini-b", "outcome": "Starting"}
    return status


def test_a_new_cluster_kuberay_rolls_back_is_in_the_history_of_its_version() -> None:
    status = rolling_out_v2()
    for at, routed in ((T0 + 50, 25), (T0 + 60, 50)):
        d = observe(status, upgrade(routed), at)
        assert d.progressing is not None and d.progressing.message.endswith(
            f"KubeRay moves the requests in steps: {routed} % to Ray cluster mini-b (target capacity 50 %), "
            f"{100 - routed} % to mini-a (target capacity 100 %)"
        )
        status = apply(status, d)
    assert status["history"][0]["rayCluster"]["peakTrafficPercent"] == 50

    # The new cluster's application fails: servegraph rolls back to v1 (the spec goes back).
    failing = upgrade(50, apps="DEPLOY_FAILED")
    status = apply(status, observe(status, failing, T0 + 62))
    rolled = observe(status, failing, T0 + 62 + STABLE_S)
    assert rolled.outcome == ROLLED_BACK and rolled.target == V1.digest
    status = apply(status, rolled)
    assert [(h["version"], h["outcome"]) for h in status["history"]][:2] == [("1", PROGRESSING), ("2", ROLLED_BACK)]

    # KubeRay sees the spec back at the active cluster's: the requests move back, said once.
    d = observe(status, upgrade(25, rolling_back=True), T0 + 80)
    assert d.history[1]["rayCluster"] == {
        "name": "mini-b",
        "outcome": "RolledBack",
        "peakTrafficPercent": 50,
        "rolledBackAt": rfc3339(T0 + 80),
    }
    assert "rayCluster" not in d.history[0], "the version rolled back to runs on the active cluster"
    (said,) = [e for e in d.events if e[1] == "ClusterRolledBack"]
    assert said == (
        "Normal",
        "ClusterRolledBack",
        "KubeRay rolls back Ray cluster mini-b of version '2' (50 % of the requests at most): "
        "mini-a serves, as the spec applied now asks",
    )
    assert d.progressing is not None and "KubeRay moves the requests back (RollbackInProgress)" in d.progressing.message
    status = apply(status, d)
    again = observe(status, upgrade(0, rolling_back=True), T0 + 90)
    assert not [e for e in again.events if e[1] == "ClusterRolledBack"], "said once"

    # The rollback done (KubeRay deleted mini-b): v1 is Ready again; the record stays.
    status = apply(status, again)
    for at in (T0 + 100, T0 + 100 + STABLE_S):
        status = apply(status, observe(status, None, at))
    assert status["rollout"]["phase"] == SERVING and status["rollout"]["digest"] == V1.digest
    assert status["history"][1]["rayCluster"]["rolledBackAt"] == rfc3339(T0 + 80)


def test_a_new_cluster_that_never_had_a_request_goes_in_one_write_and_is_rolled_back_too() -> None:
    """At 0 % of the requests KubeRay begins and ends its rollback in one status write: the
    cluster is simply gone, without having taken over."""
    status = rolling_out_v2()
    unsettled = observe(status, None, T0 + 70, settled=False)
    assert unsettled.history[0]["rayCluster"]["outcome"] == "Starting", "KubeRay has not acted on the spec yet"
    d = observe(status, None, T0 + 70)
    assert d.history[0]["rayCluster"] == {"name": "mini-b", "outcome": "RolledBack", "rolledBackAt": rfc3339(T0 + 70)}
    assert [e[2] for e in d.events if e[1] == "ClusterRolledBack"] == [
        "KubeRay rolls back Ray cluster mini-b of version '2' (no request): mini-a serves, as the spec applied now asks"
    ]


def test_a_new_cluster_that_took_over_is_promoted() -> None:
    status = rolling_out_v2()
    status = apply(status, observe(status, upgrade(100), T0 + 90))
    d = observe(status, None, T0 + 100, active="mini-b")
    assert d.history[0]["rayCluster"] == {"name": "mini-b", "outcome": "Promoted", "peakTrafficPercent": 100}
    assert not [e for e in d.events if e[1] == "ClusterRolledBack"]
    later = observe(apply(status, d), None, T0 + 200, active="mini-c")
    assert later.history[0]["rayCluster"]["outcome"] == "Promoted", "replaced later by another: still promoted"


def test_a_rollback_seen_first_goes_to_the_version_applied_before() -> None:
    """The operator was away while the new cluster started: the rollback is the version's before
    the one applied now."""
    history = [
        {"version": "1", "digest": V1.digest, "outcome": PROGRESSING},
        {"version": "2", "digest": V2.digest, "outcome": ROLLED_BACK},
    ]
    decision = Decision(target=V1.digest, rollout={"digest": V1.digest}, history=history)
    d = note(decision, upgrade(None, rolling_back=True), "mini-a", True, T0)
    assert d.history[1]["rayCluster"] == {"name": "mini-b", "outcome": "RolledBack", "rolledBackAt": rfc3339(T0)}
    assert "rayCluster" not in d.history[0]
    assert decision.history == history, "the decision given is not edited"


def test_nothing_changes_without_a_new_cluster() -> None:
    decision = Decision(target=V1.digest, rollout={"digest": V1.digest}, history=[{"digest": V1.digest}])
    assert note(decision, None, "mini-a", True, T0) is decision
    assert note(decision, {"activeRayCluster": "mini-a", "pendingRayCluster": ""}, "mini-a", True, T0) is decision
    assert note(Decision(target=None, rollout=None, history=[]), upgrade(10), "mini-a", True, T0).history == []
