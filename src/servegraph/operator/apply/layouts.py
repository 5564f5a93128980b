"""A layout of several versions rendered: the Serve config (render/canary.py) and the graph whose
resources the Ray cluster must hold (pure).

The Serve config lays the base build out with the live version's and the canary's copies
beside it (and a retiring version's side applications, kept while their requests finish).
The cluster's worker groups are planned for what runs: the base's nodes a route still uses,
and every copy, each with its own version's resources; a copy's replicas are as many as its
version asks. The groups' shapes (pod sizes, hardware classes) come from the same planner,
so a canary that would need another shape changes the cluster, and is refused at its start
(rollout/canaries.py), never rendered.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from servegraph.dag import model
from servegraph.operator.rollout.canaries import laid_out
from servegraph.render.canary import read, side_app
from servegraph.render.serve_config import config_yaml

__all__ = ["footprint", "laid_out", "serve_text"]


def serve_text(config: Mapping[str, Any]) -> str:
    return config_yaml(config)


def footprint(
    base: model.Graph, live: model.Graph | None, canary: model.Graph | None, config: Mapping[str, Any]
) -> model.Graph:
    """The graph the Ray cluster must hold for `config` (what `laid_out` gave): the base's nodes
    not scaled to zero, and each side application's copies from the version it serves."""
    state = read(config)
    zero = {
        (app["name"], d["name"])
        for app in config["applications"]
        if side_app(app["name"]) is None
        for d in app.get("deployments") or ()
        if (d.get("autoscaling_config") or {}).get("max_replicas") == 1
        and (d.get("autoscaling_config") or {}).get("min_replicas") == 0
        and (d.get("autoscaling_config") or {}).get("initial_replicas") == 0
    }
    apps: list[model.Application] = []
    for app in base.applications:
        kept = {i: n for i, n in app.nodes.items() if (app.name, i) not in zero}
        apps.append(replace(app, nodes=kept, order=tuple(i for i in app.order if i in kept)))
    graphs = {"live": live, "canary": canary}
    sides = {a["name"]: a for a in config["applications"] if side_app(a["name"]) is not None}
    for app_name, roles in sorted(state.side_apps.items()):
        for role, side in sorted(roles.items()):
            version = graphs.get(role)
            if version is None or side not in sides:
                continue
            source = next((a for a in version.applications if a.name == app_name), None)
            if source is None:
                continue
            copied = [d["name"] for d in sides[side].get("deployments") or () if d.get("name") in source.nodes]
            nodes = {i: source.nodes[i] for i in copied}
            if nodes and all(a.name != side for a in apps):
                apps.append(replace(source, name=side, nodes=nodes, order=tuple(copied), ingress=copied[0]))
    return replace(canary or live or base, applications=tuple(apps))
