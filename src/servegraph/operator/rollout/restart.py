"""Restarting a ServeGraph's Ray cluster (the `servegraph.io/restartedAt` annotation), decided (pure).

The annotation's value is rendered into the head's and every worker group's pod template
annotations (render.rayservice): KubeRay's hash of the cluster spec changes, so it builds
a new Ray cluster beside the running one and moves traffic to it once its applications are
RUNNING (its NewCluster upgrade). No request is lost, and every pod is new: an image its
pull policy says to pull `Always` (a rebuilt one with the same tag) is pulled again.

KubeRay never replaces a running cluster with `upgradeStrategy: None`, so there a new
value is refused (Applied False `RestartRefused`) and the running value stays rendered;
so does it when the annotation is removed (removing it restarts nothing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from servegraph.names import RESTARTED_AT_ANNOTATION, ConditionType
from servegraph.operator.conditions import Condition

MAX_VALUE = 128
"""An RFC 3339 time is about 25 characters; every pod template carries the value."""
REFUSED = "RestartRefused"


@dataclass(frozen=True)
class Restart:
    value: str | None
    """What to render into the pod templates (None: nothing)."""
    refused: Condition | None = None
    """Why the annotation's value is not rendered, if it is not."""


def running_value(cluster: Mapping[str, Any] | None) -> str | None:
    """The restart value the live RayService's head pod template carries."""
    template = ((cluster or {}).get("headGroupSpec") or {}).get("template") or {}
    value = ((template.get("metadata") or {}).get("annotations") or {}).get(RESTARTED_AT_ANNOTATION)
    return str(value) if value is not None else None


def decide(annotations: Mapping[str, str], strategy: str | None, live_cluster: Mapping[str, Any] | None) -> Restart:
    """The value to render, given the ServeGraph's annotations, its upgradeStrategy and the
    live RayService's rayClusterConfig (None when there is no RayService: a new cluster anyway)."""
    requested = annotations.get(RESTARTED_AT_ANNOTATION) or None
    running = running_value(live_cluster) if live_cluster is not None else None
    if requested is None or requested == running:
        return Restart(running if live_cluster is not None else None)
    if len(requested) > MAX_VALUE:
        why = (
            f"the {RESTARTED_AT_ANNOTATION} annotation is {len(requested)} characters long, at most {MAX_VALUE}: "
            "give a time, as `servegraph restart` does (e.g. 2026-01-02T03:04:05Z)"
        )
        return Restart(running, Condition(ConditionType.APPLIED, False, REFUSED, why))
    if live_cluster is not None and strategy == "None":
        why = (
            f"restart {requested!r} ({RESTARTED_AT_ANNOTATION}) not done: with spec.rayService.upgradeStrategy None "
            "KubeRay never replaces a running Ray cluster; remove upgradeStrategy (or set NewCluster) to restart "
            "without downtime, or remove the annotation"
        )
        return Restart(running, Condition(ConditionType.APPLIED, False, REFUSED, why))
    return Restart(requested)
