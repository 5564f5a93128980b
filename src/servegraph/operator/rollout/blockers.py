"""Why a rollout is stuck, from what KubeRay reports (pure).

KubeRay reports the applications of a Ray cluster it is still starting (the first
one, or the new cluster of an upgrade) only under the RayService's
`pendingServiceStatus`. Ray Serve's messages there say exactly what blocks: replicas
that cannot be scheduled (and the resources they want), a constructor that raised, an
import that failed. This module keeps that, bounded, for the ServeGraph's status
(`mirror_pending`) and names the first blocking problem for its Ready and Progressing
conditions (`blocking_problem`), so nobody needs a shell on the Ray head to learn it.
What the pods say (no node with the CPU or GPU asked for, an image that cannot be
pulled) the operator does not read: it has no permission on pods or RayClusters;
`servegraph status` shows it with the caller's own.

Bounded because Ray puts whole tracebacks and resource maps into messages: each
message keeps Ray's headline and the exception (`summarize_message`), at most
`MAX_MESSAGE` characters, and one mirror keeps at most `MAX_MESSAGES` of them,
those of applications and deployments that are not healthy first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from servegraph.raydash.dashboard import summarize_message

RUNNING = "RUNNING"
HEALTHY = "HEALTHY"
FAILED_APP_STATES = ("DEPLOY_FAILED", "UNHEALTHY")
MAX_MESSAGE = 1024
MAX_MESSAGES = 32
POD_HINT = "`servegraph status` lists its pods and why they are not running"
NO_APPLICATION = "Ray Serve reports no application yet (KubeRay deploys them once the head pod runs)"


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
