"""What KubeRay's RayService says, read for servegraph in one place (pure).

Everything the operator learns from a live RayService goes through here: its record
(`Live`: whose it is, whether KubeRay has acted on its spec, the cluster spec packed, the
Serve config's digest), the application and deployment statuses of the active cluster
(`mirror_applications`), a new-cluster upgrade in progress (`mirror_upgrade`: with KubeRay
1.7's incremental upgrade, each cluster's share of the requests and its Serve target capacity,
and KubeRay's rollback when the spec reverts; `traffic_split` says it in words), the cluster
KubeRay is still starting (`mirror_pending`), and the first problem that blocks a rollout
(`blocking_problem`), which Ready and Progressing name.

KubeRay reports the applications of a Ray cluster it is still starting (the first
one, or the new cluster of an upgrade) only under the RayService's
`pendingServiceStatus`. Ray Serve's messages there say exactly what blocks: replicas
that cannot be scheduled (and the resources they want), a constructor that raised, an
import that failed. What the pods say (no node with the CPU or GPU asked for, an image
that cannot be pulled) the operator does not read: it has no permission on pods or
RayClusters; `servegraph status` shows it with the caller's own.

Bounded because Ray puts whole tracebacks and resource maps into messages: each
message keeps Ray's headline and the exception (`raydash.dashboard.summarize_message`,
Ray Serve's message format, shared with `servegraph up`), at most `MAX_MESSAGE`
characters, and one mirror keeps at most `MAX_MESSAGES` of them, those of applications
and deployments that are not healthy first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from servegraph.operator.packed import pack, unpack
from servegraph.raydash.dashboard import summarize_message
from servegraph.render.kuberay_features import INCREMENTAL

RUNNING = "RUNNING"
HEALTHY = "HEALTHY"
FAILED_APP_STATES = ("DEPLOY_FAILED", "UNHEALTHY")
DEPLOYING_APP_STATES = ("NOT_STARTED", "DEPLOYING")
MAX_MESSAGE = 1024
SUSPEND_STATES = ("Suspended", "Suspending")
MAX_MESSAGES = 32
POD_HINT = "`servegraph status` lists its pods and why they are not running"
NO_APPLICATION = "Ray Serve reports no application yet (KubeRay deploys them once the head pod runs)"

MatchKey = tuple[Any, ...]
"""(spec hash, owner uid) of a rendered RayService: equal keys, nothing to write."""


def text_digest(text: str) -> str:
    """What a Serve config text is compared by, instead of holding the text (~11 KiB each)."""
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def live_digest(live: Mapping[str, Any]) -> str:
    return text_digest(str((live.get("spec") or {}).get("serveConfigV2") or ""))


@dataclass(frozen=True)
class Owner:
    """The controller owner reference of a RayService: who may write it."""

    kind: str
    name: str
    uid: str


@dataclass(frozen=True)
class Live:
    """What a reconcile needs of a live RayService, kept instead of the object.

    `matched` is the MatchKey of the desired RayService the object was found to
    match when it was compared (None: it did not, or nothing was desired yet).
    """

    matched: MatchKey | None
    applications: dict[str, Any]
    compared: bool = True
    """False when nothing was desired yet to compare with (the reconcile then reads it)."""
    upgrade: dict[str, Any] | None = None
    """KubeRay's new-cluster upgrade in progress, if any (mirror_upgrade)."""
    pending: dict[str, Any] | None = None
    """The Ray cluster KubeRay is starting, its applications and their messages, bounded
    (mirror_pending): why a first rollout or an upgrade is stuck."""
    owner: Owner | None = None
    managers: tuple[str, ...] = ()
    """The field managers that wrote it: who made it, when no controller owns it."""
    settled: bool = False
    """KubeRay has acted on the object's current spec (status.observedGeneration caught up)."""
    packed_cluster: bytes | None = None
    """The live rayClusterConfig (`cluster`), packed: ~8 KiB as dicts, ~0.5 KiB so."""
    serve_digest: str = ""
    """`text_digest` of the live serveConfigV2: whether an apply changes it."""
    raw: dict[str, Any] | None = None
    """The object itself, only while it was not compared (start-up): compared on first use."""
    deleting: bool = False
    """Deleted, waiting for KubeRay's finalizer (it removes the Ray clusters first)."""
    resource_version: str | None = None
    """The version this record was made from: a write carrying it lands only on that object
    (ownership.apply_owned), so what was decided from this record still holds."""
    active_cluster: str = ""
    """The Ray cluster serving (KubeRay's activeServiceStatus): whether a new one took over."""
    suspended: str = ""
    """KubeRay's own suspend (1.7): "Suspending" while it deletes the Ray clusters, then
    "Suspended"; "" otherwise."""

    @property
    def cluster(self) -> dict[str, Any] | None:
        """The live rayClusterConfig: new renders keep its worker-group order, predictions read it."""
        return None if self.packed_cluster is None else dict(unpack(self.packed_cluster))


def live_record(
    body: Mapping[str, Any], matched: MatchKey | None, compared: bool = True, serve_digest: str | None = None
) -> Live:
    """A `Live` from a RayService as the API server returned or the watch delivered it
    (`serve_digest`: its Serve config's, when the caller has it already)."""
    meta = body.get("metadata") or {}
    status = body.get("status") or {}
    spec = body.get("spec") or {}
    owner, managers = _whose(meta)
    return Live(
        matched,
        mirror_applications(body),
        compared=compared,
        upgrade=mirror_upgrade(body),
        pending=mirror_pending(body),
        owner=owner,
        managers=managers,
        settled=int(status.get("observedGeneration") or 0) >= int(meta.get("generation") or 0) > 0,
        packed_cluster=None if spec.get("rayClusterConfig") is None else pack(spec["rayClusterConfig"]),
        serve_digest=serve_digest if serve_digest is not None else live_digest(body),
        raw=None if compared else dict(body),
        deleting=bool(meta.get("deletionTimestamp")),
        resource_version=str(meta["resourceVersion"]) if meta.get("resourceVersion") else None,
        active_cluster=str((status.get("activeServiceStatus") or {}).get("rayClusterName") or ""),
        suspended=next((k for k in SUSPEND_STATES if _condition_true(status.get("conditions") or (), k)), ""),
    )


def stranger(body: Mapping[str, Any]) -> Live:
    """What is kept of a RayService no ServeGraph renders (no graph label, no ServeGraph owner):
    that it exists and whose it is, enough to refuse it as a `conflict` without reading it."""
    meta = body.get("metadata") or {}
    owner, managers = _whose(meta)
    version = str(meta["resourceVersion"]) if meta.get("resourceVersion") else None
    deleting = bool(meta.get("deletionTimestamp"))
    return Live(None, {}, owner=owner, managers=managers, deleting=deleting, resource_version=version)


def _whose(meta: Mapping[str, Any]) -> tuple[Owner | None, tuple[str, ...]]:
    """The controller owner reference, and the field managers that wrote the object (not KubeRay's status)."""
    owner = next(
        (
            Owner(str(o.get("kind", "")), str(o.get("name", "")), str(o.get("uid", "")))
            for o in meta.get("ownerReferences") or ()
            if o.get("controller")
        ),
        None,
    )
    managers = {
        str(m["manager"]) for m in meta.get("managedFields") or () if m.get("manager") and not m.get("subresource")
    }
    return owner, tuple(sorted(managers))


def mirror_upgrade(rayservice: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """KubeRay's new-cluster upgrade in progress, or None.

    While KubeRay builds a pending cluster for a changed cluster spec, the active one
    keeps serving the previous version: the status must say so, not Ready. With
    `NewClusterWithIncrementalUpgrade` both serve meanwhile, in the shares the HTTPRoute's
    weights give them (`incremental`, KubeRay's per-cluster `trafficRoutedPercent`,
    `targetCapacity` and `lastTrafficMigratedTime`); `rollingBack` is KubeRay's
    RollbackInProgress: the spec went back to the active cluster's (or on to a third one) and
    the requests move back to the active cluster before the pending one is deleted.
    """
    status = (rayservice or {}).get("status") or {}
    pending = status.get("pendingServiceStatus") or {}
    conditions = status.get("conditions") or []
    upgrading = _condition_true(conditions, "UpgradeInProgress")
    active_status = status.get("activeServiceStatus") or {}
    active = active_status.get("rayClusterName")
    # A pending cluster without an active one is the first cluster starting, not an upgrade.
    if not upgrading and not (pending.get("rayClusterName") and active):
        return None
    apps = pending.get("applicationStatuses") or {}
    out: dict[str, Any] = {
        "activeRayCluster": active or "",
        "pendingRayCluster": pending.get("rayClusterName", ""),
        "applications": {name: (apps[name] or {}).get("status", "") for name in sorted(apps)},
    }
    strategy = (((rayservice or {}).get("spec") or {}).get("upgradeStrategy") or {}).get("type")
    if strategy == INCREMENTAL:
        out["incremental"] = {"active": _share(active_status), "pending": _share(pending)}
    if _condition_true(conditions, "RollbackInProgress"):
        out["rollingBack"] = True
    return out


def _condition_true(conditions: Iterable[Mapping[str, Any]], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def _share(service_status: Mapping[str, Any]) -> dict[str, Any]:
    """One cluster's part in an incremental upgrade, as KubeRay reports it (what it reports)."""
    out: dict[str, Any] = {}
    for key in ("trafficRoutedPercent", "targetCapacity"):
        value = service_status.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = max(0, min(100, value))
    when = service_status.get("lastTrafficMigratedTime")
    if isinstance(when, str) and len(when) <= 64:
        out["lastTrafficMigratedTime"] = when
    return out


def traffic_split(upgrade: Mapping[str, Any] | None) -> str | None:
    """An incremental upgrade's split in words (None for any other upgrade), e.g. `KubeRay moves
    the requests in steps: 25 % to Ray cluster mini-b (target capacity 50 %), 75 % to mini-a
    (target capacity 100 %)`."""
    if not upgrade or "incremental" not in upgrade:
        return None
    shares = upgrade["incremental"]
    pending, active = shares.get("pending") or {}, shares.get("active") or {}
    new = upgrade.get("pendingRayCluster") or "(pending)"
    old = upgrade.get("activeRayCluster") or "the active cluster"
    if upgrade.get("rollingBack"):
        lead = "KubeRay moves the requests back (RollbackInProgress)"
        parts = [_part(active, f"Ray cluster {old}"), _part(pending, new)]
    else:
        lead = "KubeRay moves the requests in steps"
        parts = [_part(pending, f"Ray cluster {new}"), _part(active, old)]
    return f"{lead}: {', '.join(parts)}"


def _part(share: Mapping[str, Any], cluster: str) -> str:
    routed = share.get("trafficRoutedPercent")
    text = f"{'?' if routed is None else routed} % to {cluster}"
    if share.get("targetCapacity") is not None:
        text += f" (target capacity {share['targetCapacity']} %)"
    return text


def mirror_applications(rayservice: Mapping[str, Any] | None) -> dict[str, Any]:
    """Per-application and per-deployment statuses of the active cluster (messages bounded)."""
    if not rayservice:
        return {}
    active = (rayservice.get("status") or {}).get("activeServiceStatus") or {}
    return mirror_apps(active.get("applicationStatuses"))


def bounded(message: Any) -> str:
    """Ray's message without traceback frames, at most MAX_MESSAGE characters (head and tail kept:
    Ray's headline says what failed, its last line why)."""
    text = summarize_message(str(message or ""))
    if len(text) <= MAX_MESSAGE:
        return text
    tail = MAX_MESSAGE // 3
    return text[: MAX_MESSAGE - tail - 3] + " … " + text[-tail:]


def one_line(text: str) -> str:
    return " ".join(text.split())


def mirror_apps(apps: Mapping[str, Any] | None) -> dict[str, Any]:
    """KubeRay's `applicationStatuses` → {app: {status, message?, deployments: {name: {status, message?}}}}."""
    apps = apps or {}
    out: dict[str, Any] = {}
    for name in sorted(apps):
        app = apps[name] or {}
        deployments = app.get("serveDeploymentStatuses") or {}
        entry: dict[str, Any] = {"status": str(app.get("status") or "")}
        if app.get("message"):
            entry["message"] = bounded(app["message"])
        entry["deployments"] = {}
        for d in sorted(deployments):
            dep = deployments[d] or {}
            entry["deployments"][d] = {"status": str(dep["status"])} if dep.get("status") else {}
            if dep.get("message"):
                entry["deployments"][d]["message"] = bounded(dep["message"])
        out[name] = entry
    _keep_messages(out)
    return out


def _keep_messages(apps: dict[str, Any]) -> None:
    """At most MAX_MESSAGES messages in one mirror: those of what is not healthy first."""
    holders: list[tuple[int, dict[str, Any]]] = []
    for app in apps.values():
        if "message" in app:
            holders.append((0 if app["status"] in FAILED_APP_STATES else 2 if app["status"] != RUNNING else 4, app))
        for dep in app["deployments"].values():
            if "message" in dep:
                status = dep.get("status")
                holders.append((1 if status == "UNHEALTHY" else 3 if status != HEALTHY else 5, dep))
    holders.sort(key=lambda h: h[0])  # stable: within a rank, in name order
    for _, holder in holders[MAX_MESSAGES:]:
        del holder["message"]


def mirror_pending(rayservice: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The Ray cluster KubeRay is starting and its applications; None when there is none.

    KubeRay's copy of that RayCluster's own status (`rayClusterStatus`) is left out: KubeRay
    writes the RayService's status only when applications, conditions or cluster names
    change, never for the RayCluster's status alone, so the copy may be as old as the
    cluster (empty while its head pod waits for a node). `servegraph status` reads the
    RayCluster and its pods themselves, with the caller's credentials.
    """
    pending = ((rayservice or {}).get("status") or {}).get("pendingServiceStatus") or {}
    name = pending.get("rayClusterName")
    if not name:  # KubeRay writes an empty pendingServiceStatus when there is no pending cluster
        return None
    return {"rayClusterName": str(name), "applications": mirror_apps(pending.get("applicationStatuses"))}


def first_app_problem(apps: Mapping[str, Any], expected: Sequence[str] = ()) -> str | None:
    """The first blocking problem Ray Serve names, e.g. `application "a2": deployment "n3": <message>`.

    Failed applications first, then the graph's order; within one, an unhealthy
    deployment's message (it names the node), then any other deployment's, then the
    application's. None when no application that is not RUNNING has a message.
    """
    order = [a for a in expected if a in apps] + sorted(a for a in apps if a not in expected)
    waiting = [a for a in order if (apps[a] or {}).get("status") != RUNNING]
    waiting.sort(key=lambda a: (apps[a] or {}).get("status") not in FAILED_APP_STATES)
    for name in waiting:
        app = apps[name] or {}
        deployments = app.get("deployments") or {}
        unhealthy = sorted(deployments, key=lambda d: deployments[d].get("status") != "UNHEALTHY")
        for dep in unhealthy:
            if deployments[dep].get("status") != HEALTHY and deployments[dep].get("message"):
                return f'application "{name}": deployment "{dep}": {one_line(deployments[dep]["message"])}'
        if app.get("message"):
            return f'application "{name}": {one_line(app["message"])}'
    return None


def cluster_problem(pending: Mapping[str, Any]) -> str | None:
    """Why the pending cluster runs no application yet, when Ray Serve reports none."""
    if pending.get("applications"):
        return None
    return f"Ray cluster {pending.get('rayClusterName', '')}: {NO_APPLICATION}; {POD_HINT}"


def blocking_problem(
    applications: Mapping[str, Any], pending: Mapping[str, Any] | None, expected: Iterable[str] = ()
) -> str | None:
    """The first blocking problem of a rollout: in the cluster being started (its applications,
    then the cluster itself), else among the active cluster's applications."""
    names = list(expected)
    if pending:
        found = first_app_problem(pending.get("applications") or {}, names) or cluster_problem(pending)
        if found is not None:
            return found
    return first_app_problem(applications, names)
