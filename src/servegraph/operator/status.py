"""ServeGraph status from what the reconcile saw (pure).

KubeRay's own Ready turns true as soon as one serve endpoint exists, even with
an application DEPLOY_FAILED; ours requires every application of the graph to
be RUNNING, which is what a user of the graph means by ready.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servegraph.graph import Graph
from servegraph.operator.conditions import Condition

RUNNING = "RUNNING"


def mirror_applications(rayservice: Mapping[str, Any] | None) -> dict[str, Any]:
    """Per-application and per-deployment statuses of the active cluster."""
    if not rayservice:
        return {}
    active = (rayservice.get("status") or {}).get("activeServiceStatus") or {}
    apps = active.get("applicationStatuses") or {}
    out: dict[str, Any] = {}
    for name in sorted(apps):
        app = apps[name] or {}
        deployments = app.get("serveDeploymentStatuses") or {}
        entry: dict[str, Any] = {"status": app.get("status", "")}
        if app.get("message"):
            entry["message"] = app["message"]
        entry["deployments"] = {
            d: {
                k: v
                for k, v in (("status", deployments[d].get("status", "")), ("message", deployments[d].get("message")))
                if v
            }
            for d in sorted(deployments)
        }
        out[name] = entry
    return out


def ready_condition(graph: Graph | None, exists: bool, applications: Mapping[str, Any]) -> Condition:
    if graph is None:
        return Condition("Ready", False, "NoValidGraph", "no valid graph has been applied yet")
    if not exists:
        return Condition("Ready", False, "RayServiceMissing", "the RayService does not exist yet")
    expected = [a.name for a in graph.applications]
    missing = [a for a in expected if a not in applications]
    if len(missing) == len(expected):
        return Condition("Ready", False, "WaitingForApplications", "KubeRay reports no application status yet")
    not_running = [
        f"{a}: {applications[a]['status']}"
        for a in expected
        if a in applications and applications[a]["status"] != RUNNING
    ]
    not_running += [f"{a}: not reported" for a in missing]
    if not_running:
        return Condition("Ready", False, "ApplicationsNotRunning", "; ".join(not_running))
    return Condition(
        "Ready", True, "AllApplicationsRunning", f"{len(expected)} of {len(expected)} applications RUNNING"
    )


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


def contains(live: Any, desired: Any) -> bool:
    """Whether `live` has every field `desired` sets, with the same value.

    Fields the API server or KubeRay add (defaults, status) do not count as drift;
    a changed or removed field of ours does.
    """
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(k in live and contains(live[k], v) for k, v in desired.items())
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(live) == len(desired)
            and all(contains(a, b) for a, b in zip(live, desired, strict=True))
        )
    return bool(live == desired)
