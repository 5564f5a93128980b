"""A deployed canary config read back: the versions, the split, the side applications (pure).

`read` is what lets `servegraph canary|promote|abort` work on a plain Ray cluster, which keeps
no state but the config it runs: the base's routers say the routes, the ingress also the
split, the stats token and the original scaling of the nodes set to zero, and each side
application's args its copies. From them the base, live and canary versions are rebuilt as
the renderer wrote them, so `render/canary.py` lays them out again exactly.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from servegraph.dag.args import (
    CANARY,
    LIVE,
    BuildError,
    Settings,
    Sticky,
    decode_settings,
    decode_side,
    graph_identity,
    without_settings,
)
from servegraph.dag.nodeargs import Problems, decode_node
from servegraph.render.canary_plan import AppNodes, layered

_SIDE = re.compile(r"^(?P<app>.+)~(?P<digest>[0-9a-f]{12})$")


@dataclass(frozen=True)
class Split:
    """How the ingress shares requests with the canary: `weight` percent of them, `mirror`
    percent of the live ones copied to it, sticky per `sticky_header` or `sticky_field`;
    `stats` the token that reads the routers' own aggregates (no Prometheus needed)."""

    weight: int = 0
    mirror: int = 0
    sticky_header: str | None = None
    sticky_field: str | None = None
    stats: str | None = None

    def __post_init__(self) -> None:
        for name in ("weight", "mirror"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100:
                raise ValueError(f"{name}: must be a whole percent from 0 to 100, got {value!r}")
        if self.sticky_header and self.sticky_field:
            raise ValueError("sticky: a header or a payload field, not both")


@dataclass(frozen=True)
class CanaryState:
    """A deployed config read back: the three versions' configs as rendered (live and canary
    rebuilt from the base and their side applications), their versions and the split."""

    base: dict[str, Any]
    live: dict[str, Any] | None = None
    canary: dict[str, Any] | None = None
    base_version: str | None = None
    live_version: str | None = None
    canary_version: str | None = None
    split: Split | None = None
    side_apps: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Per base application: its side application's name by route (live, canary)."""
    retiring: tuple[str, ...] = ()
    """Side applications no route uses (kept while requests drain)."""
    deployed: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Every side application as deployed, by name."""

    def side_apps_of(self, role: str) -> list[str]:
        """The side applications route `role` uses and the other route does not."""
        other = LIVE if role == CANARY else CANARY
        mine = {r[role] for r in self.side_apps.values() if role in r}
        return sorted(mine - {r[other] for r in self.side_apps.values() if other in r})


def side_app(name: str) -> tuple[str, str] | None:
    """(base application, digest12) of a side application's name, or None."""
    m = _SIDE.fullmatch(name)
    return (m["app"], m["digest"]) if m else None


def version_of(config: Mapping[str, Any] | None) -> str | None:
    """The graph version the routers of a rendered config carry (None: no router says it)."""
    for app in (config or {}).get("applications", []):
        for d in app.get("deployments", []):
            _, version = graph_identity(d.get("user_config"))
            if version is not None:
                return version
    return None


def as_rendered(d: Mapping[str, Any], nodes: AppNodes) -> dict[str, Any]:
    if d.get("name") in nodes.routers and "user_config" in d:
        return {**d, "user_config": without_settings(d["user_config"])}
    return dict(d)


def read(deployed: Mapping[str, Any]) -> CanaryState:
    """What a deployed config runs: see CanaryState. ValueError when a router's routes or a
    side application's args do not read."""
    apps = list(deployed["applications"])
    names = {a["name"] for a in apps}
    sides = {a["name"]: a for a in apps if (s := side_app(a["name"])) is not None and s[0] in names}
    bases: list[dict[str, Any]] = []
    settings: dict[str, Settings] = {}
    for app in apps:
        if app["name"] in sides:
            continue
        restored, said = _restore(app)
        bases.append(restored)
        settings[app["name"]] = said
    base = {**{k: v for k, v in deployed.items() if k != "applications"}, "applications": bases}
    base_version = version_of(base)
    by_role: dict[str, dict[str, str]] = {}
    versions: dict[str, str] = {}
    split: Split | None = None
    for name, said in settings.items():
        for role, route in ((LIVE, said.live), (CANARY, said.canary)):
            if route is None:
                continue
            versions.setdefault(role, route.version)
            if route.app is not None:
                by_role.setdefault(name, {})[role] = route.app
            if role == CANARY and split is None and (route.weight or route.mirror or said.stats or route.sticky):
                sticky = route.sticky or Sticky()
                split = Split(route.weight, route.mirror, sticky.header, sticky.field, said.stats)
    used = {s for roles in by_role.values() for s in roles.values()}
    return CanaryState(
        base=base,
        live=_rebuilt(base, settings, sides, LIVE, versions.get(LIVE)),
        canary=_rebuilt(base, settings, sides, CANARY, versions.get(CANARY)),
        base_version=base_version,
        live_version=versions.get(LIVE, base_version),
        canary_version=versions.get(CANARY),
        split=split if split is not None else (Split() if CANARY in versions else None),
        side_apps=by_role,
        retiring=tuple(sorted(set(sides) - used)),
        deployed=sides,
    )


def _restore(app: Mapping[str, Any]) -> tuple[dict[str, Any], Settings]:
    """A base application as rendered (routes out, zeroed nodes' scaling back) and what its
    ingress router said."""
    nodes = AppNodes.of(app)
    said = Settings()
    if nodes.ingress in nodes.routers:
        said = decode_settings(nodes.deployments.get(nodes.ingress, {}).get("user_config"))
    out = []
    for d in app.get("deployments", []):
        d = as_rendered(d, nodes)
        if d.get("name") in said.scaled:
            original = said.scaled[d["name"]]
            if isinstance(original, Mapping):
                d["autoscaling_config"] = dict(original)
        out.append(d)
    return {**app, "deployments": out}, said


def _rebuilt(
    base: Mapping[str, Any],
    settings: Mapping[str, Settings],
    sides: Mapping[str, Mapping[str, Any]],
    role: str,
    version: str | None,
) -> dict[str, Any] | None:
    """The config of the version on route `role`, from the base and its side applications."""
    if version is None:
        return None
    apps = []
    for app in base["applications"]:
        route = settings[app["name"]].route(role)
        side = sides.get(route.app) if route is not None and route.app is not None else None
        if route is not None and route.app is not None and side is None:
            raise ValueError(
                f'application "{app["name"]}": its {role} route names "{route.app}", which is not deployed'
            )
        apps.append(_merged(app, side, version if route is not None else None))
    return {**{k: v for k, v in base.items() if k != "applications"}, "applications": apps}


def _merged(app: Mapping[str, Any], side: Mapping[str, Any] | None, version: str | None) -> dict[str, Any]:
    """The application of a version: the base's nodes with the side application's copies in
    their place, as far as the ingress reaches; routers labelled with `version`."""
    args = dict(app["args"])
    entries = {e["id"]: e for e in args["nodes"]}
    deployments = {d["name"]: d for d in app.get("deployments", [])}
    if side is not None:
        try:
            decoded = decode_side(side["args"])
        except BuildError as e:
            raise ValueError(f'side application "{side["name"]}": {e.problems[0]}') from None
        for entry in side["args"]["nodes"]:
            if entry["id"] in decoded.copies:
                entries[entry["id"]] = entry
        deployments.update({d["name"]: d for d in side.get("deployments", []) if d["name"] in decoded.copies})
    edges = {i: _edges(e) for i, e in entries.items()}
    reach: set[str] = set()
    todo = [args["ingress"]]
    while todo:
        node = todo.pop()
        if node not in reach:
            reach.add(node)
            todo.extend(edges[node])
    order = layered(edges, reach)
    args["nodes"] = [entries[i] for i in order]
    out_deployments = [_labelled(deployments[i], version) for i in order if i in deployments]
    return {**app, "args": args, "deployments": out_deployments}


def _edges(entry: Mapping[str, Any]) -> tuple[str, ...]:
    node = decode_node(Problems(), "", entry)
    return node.edges if node is not None else ()


def _labelled(d: Mapping[str, Any], version: str | None) -> dict[str, Any]:
    user = d.get("user_config")
    name, old = graph_identity(user)
    if version is None or old is None or old == version:
        return dict(d)
    assert isinstance(user, Mapping)
    inner = dict(user["servegraph"])
    inner["graph"] = {"name": name, "version": version}
    return {**d, "user_config": {**user, "servegraph": inner}}
