"""Two versions of a graph in one Ray Serve config: the canary's layout (pure, dicts in and out).

The operator and `servegraph canary|promote|abort` on a plain Ray cluster (which can only
read back the config it runs) share these functions:

* `plan(base_app, new_app)` — the copies a version needs beside the base, or a Refusal
  (`canary_plan.py`, which says why a node is copied);
* `layout(base, live, canary, split)` — the config that serves them: each base application
  as deployed (its args unchanged, so no replica restarts) with its routers' routes and
  its unused nodes scaled to zero, and a side application `a~<digest12>` per version that
  has copies (route_prefix null; named by its args' digest, so the same version's copies
  are the same application whether they serve as canary or as live);
* `read(deployed)` — the versions, the split and the side applications, with the base,
  live and canary configs rebuilt from it; `promoted`, `aborted`, `weighted`, `settled`.

Every output is deterministic (KubeRay re-pushes a serveConfigV2 on any byte change).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from servegraph.dag.args import CANARY, LIVE, Route, Sticky, encode_settings, encode_side
from servegraph.render.canary_plan import (
    INGRESS_CHANGED,
    REASONS,
    AppNodes,
    CanaryRefused,
    Copies,
    Refusal,
    plan,
    plan_config,
    ready,
)
from servegraph.render.canary_state import CanaryState, Split, as_rendered, read, side_app, version_of

__all__ = [
    "REASONS",
    "CanaryRefused",
    "CanaryState",
    "Copies",
    "Refusal",
    "Split",
    "aborted",
    "layout",
    "plan",
    "plan_config",
    "promoted",
    "read",
    "ready",
    "settled",
    "side_app",
    "version_of",
    "weighted",
]

SERVE_DEFAULT_MAX_ONGOING = 5
"""Ray Serve 2.60's `max_ongoing_requests` when a deployment sets none."""
ZERO = {"min_replicas": 0, "max_replicas": 1, "initial_replicas": 0, "downscale_delay_s": 0, "upscale_delay_s": 0}
"""The autoscaling_config of a base node no route uses: no replica, and one again at once if a
request still in flight reaches it."""


def _digest(args: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(args, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]


def _side_config(base: AppNodes, new_app: Mapping[str, Any], copies: Copies) -> dict[str, Any]:
    """The side application of one version: its copies, and by name what they call in the base."""
    new = AppNodes.of(new_app)
    entries = [new.entries[i] if i in copies.nodes else base.entries[i] for i in copies.side]
    args = encode_side(base.name, list(copies.nodes), entries, (new_app.get("args") or {}).get("telemetry"))
    out: dict[str, Any] = {"name": f"{base.name}~{_digest(args)}", "route_prefix": None}
    out.update({k: new_app[k] for k in ("import_path", "runtime_env") if k in new_app})
    out["args"] = args
    out["deployments"] = [dict(new.deployments[i]) for i in copies.side if i in copies.nodes and i in new.deployments]
    return out


def _copies(base_app: Mapping[str, Any], new_app: Mapping[str, Any] | None) -> Copies | None:
    if new_app is None:
        return None
    planned = plan(base_app, new_app)
    if isinstance(planned, Refusal):
        raise CanaryRefused(planned)
    return planned


def layout(
    base: Mapping[str, Any],
    live: Mapping[str, Any] | None,
    canary: Mapping[str, Any] | None,
    split: Split | None,
    *,
    keep: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The Serve config that runs `live` (None: the base itself) and `canary` (None: none)
    beside `base`, all three rendered configs of the same graph; `split` shares requests
    with the canary; `keep` are side applications carried as they are (draining).

    CanaryRefused when `plan` refuses a version for an application (`plan_config` says
    it for the whole config first)."""
    for version in (live, canary):
        if version is not None:
            refused = plan_config(base, version)
            if isinstance(refused, Refusal):
                raise CanaryRefused(refused)
    base_version, live_version, canary_version = version_of(base), version_of(live), version_of(canary)
    by_name = {a["name"]: a for a in (live or {}).get("applications", [])}
    canary_by_name = {a["name"]: a for a in (canary or {}).get("applications", [])}
    kept = {k["name"]: dict(k) for k in keep}
    apps: list[dict[str, Any]] = []
    for app in base["applications"]:
        name = app["name"]
        nodes = AppNodes.of(app)
        sides: list[dict[str, Any]] = []
        routes: dict[str, Route | None] = {LIVE: None, CANARY: None}
        used = set(nodes.order)
        for role, versions, label in ((LIVE, by_name, live_version), (CANARY, canary_by_name, canary_version)):
            copies = _copies(app, versions.get(name)) if versions else None
            if copies is None:
                continue
            side = _side_config(nodes, versions[name], copies) if copies.nodes else None
            if side is not None and all(s["name"] != side["name"] for s in sides):
                sides.append(side)
            # The live route exists where it differs from the base; the canary's wherever a router
            # can carry it (even a version with nothing to copy here, e.g. back to the base, is
            # chosen, labelled and promoted as one).
            differs = label != base_version or role == CANARY
            if side is not None or (differs and nodes.ingress in nodes.routers):
                routes[role] = Route(label or "", side["name"] if side else None, copies.targets)
            if role == LIVE:
                used = set(nodes.order) - copies.unused
            else:
                used |= set(nodes.order) - copies.unused
        apps.append(_base_app(app, nodes, routes, split, set(nodes.order) - used))
        apps.extend(sides)
        for s in sides:
            kept.pop(s["name"], None)  # draining, and used again: as computed
        apps.extend(kept.pop(k) for k in sorted(kept) if (side_app(k) or ("", ""))[0] == name)
    return {**{k: v for k, v in base.items() if k != "applications"}, "applications": apps}


def _base_app(
    app: Mapping[str, Any], nodes: AppNodes, routes: Mapping[str, Route | None], split: Split | None, zero: set[str]
) -> dict[str, Any]:
    live, canary = routes[LIVE], routes[CANARY]
    if live is None and canary is None and not zero:
        return {**app, "deployments": [as_rendered(d, nodes) for d in app.get("deployments", [])]}
    if nodes.ingress not in nodes.routers:
        raise CanaryRefused(
            Refusal(nodes.name, INGRESS_CHANGED, f'application "{nodes.name}": no router at its ingress')
        )
    choosing = canary
    if canary is not None and split is not None:
        ingress = nodes.deployments.get(nodes.ingress, {})
        busy = ingress.get("max_ongoing_requests", SERVE_DEFAULT_MAX_ONGOING)
        sticky = (
            Sticky(header=split.sticky_header.lower())
            if split.sticky_header
            else Sticky(field=split.sticky_field)
            if split.sticky_field
            else None
        )
        choosing = Route(canary.version, canary.app, canary.nodes, split.weight, split.mirror, busy, sticky)
    scaled = {i: nodes.deployments[i].get("autoscaling_config") for i in sorted(zero)}
    out = []
    for d in app.get("deployments", []):
        d = dict(d)
        name = d.get("name")
        if name in nodes.routers:
            at_ingress = name == nodes.ingress
            d["user_config"] = encode_settings(
                d.get("user_config"),
                live,
                choosing if at_ingress else canary,
                split.stats if at_ingress and split is not None else None,
                scaled if at_ingress else None,
            )
        if name in zero:
            policy = (d.get("autoscaling_config") or {}).get("policy")
            d["autoscaling_config"] = {**ZERO, **({"policy": policy} if policy is not None else {})}
        out.append(d)
    return {**app, "deployments": out}


def _layout_of(
    state: CanaryState,
    live: dict[str, Any] | None,
    canary: dict[str, Any] | None,
    split: Split | None,
    keep: Sequence[str] = (),
) -> dict[str, Any]:
    return layout(state.base, live, canary, split, keep=[state.deployed[k] for k in keep if k in state.deployed])


def weighted(deployed: Mapping[str, Any], split: Split) -> dict[str, Any]:
    """The deployed canary with a new split (ValueError when no canary runs)."""
    state = read(deployed)
    if state.canary is None:
        raise ValueError("no canary runs")
    return _layout_of(state, state.live, state.canary, split, state.retiring)


def promoted(deployed: Mapping[str, Any], drain: bool = False) -> dict[str, Any]:
    """The canary as live, alone: its side application kept as it is (no replica restarts),
    the previous live's removed (kept, with `drain`, until `settled`), base nodes no route
    uses scaled to zero. ValueError when no canary runs."""
    state = read(deployed)
    if state.canary is None:
        raise ValueError("no canary runs")
    old = state.side_apps_of(LIVE) if drain else []
    return _layout_of(state, state.canary, None, None, [*state.retiring, *old] if drain else ())


def aborted(deployed: Mapping[str, Any], drain: bool = False) -> dict[str, Any]:
    """The live version alone: the canary's route and side application removed (kept, with
    `drain`, until `settled`); the base and live replicas untouched."""
    state = read(deployed)
    old = state.side_apps_of(CANARY) if drain else []
    return _layout_of(state, state.live, None, None, [*state.retiring, *old] if drain else ())


def settled(deployed: Mapping[str, Any]) -> dict[str, Any]:
    """The deployed config without the side applications no route uses."""
    state = read(deployed)
    return _layout_of(state, state.live, state.canary, state.split)
