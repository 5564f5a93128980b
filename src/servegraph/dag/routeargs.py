"""What a router's `user_config` says about canaries: its routes, both ways.

During a canary an application runs as its *base* Serve application (the version it was
built from, whose args never change, so its replicas never restart) plus a *side*
application per other version, holding that version's copies of the nodes that differ
(`servegraph.render.canary`). The base's routers learn, through `user_config` (applied by
`reconfigure`, no restart), the routes: `live` and `canary`, each the version it serves,
the side application holding its copies, and the copies a base router must call there
instead of its own child (by node id). Only the ingress router chooses a route per
request (weight, mirror, sticky key) and tells the routers below in `ROUTE_HEADER`; it
also keeps the stats token and the original scaling of the base nodes no route uses.

The other half of `servegraph.dag.args` (which re-exports what is public here): one codec
for the renderer's `encode_settings` and the runtime's `decode_settings`. Standard library
only: this runs in the Ray image.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ROUTER_CONFIG_KEY = "servegraph"
"""The key of a router's `user_config` that holds what servegraph tells it."""

LIVE = "live"
CANARY = "canary"
ROUTE_NAMES = (LIVE, CANARY)
ROUTE_HEADER = "x-servegraph-route"
"""Internal: the route the ingress chose, for the routers below it (never forwarded to user
code unless the application lists it; the ingress overwrites what a client sends)."""
VERSION_HEADER = "x-servegraph-version"
"""A client's pin: the canary's or the live version string, or `canary` / `stable`."""
STATS_HEADER = "x-servegraph-stats"
"""A GET with this header set to the stats token answers the per-route aggregates as JSON."""
PIN_ALIASES = {"canary": CANARY, "stable": LIVE}
MAX_PERCENT = 100
MAX_TOKEN = 256
"""The stats token's length at most: bounded, as everything a tenant can write."""


class SettingsError(ValueError):
    """A router's `user_config` does not say routes as servegraph writes them; `str()` lists
    every problem. A ValueError: Serve reports a failing `reconfigure` on the deployment."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass(frozen=True)
class Sticky:
    """The request key a canary's choice sticks to: a header, or a top-level JSON payload field."""

    header: str | None = None
    field: str | None = None


@dataclass(frozen=True)
class Route:
    """One version a request may be served by.

    `app` is the side application holding the version's copies (None: all of its nodes are
    the base's); `nodes` the copies a base router calls there instead of its own child.
    Only the canary route has `weight` (percent of requests), `mirror` (percent of live
    requests copied to it), `busy` (the ingress's in-flight requests at which mirroring
    stops) and `sticky`.
    """

    version: str
    app: str | None = None
    nodes: frozenset[str] = frozenset()
    weight: int = 0
    mirror: int = 0
    busy: int = 0
    sticky: Sticky | None = None


@dataclass(frozen=True)
class Settings:
    """What a router's `user_config` says: the graph's identity, the routes, and (the
    ingress only) the stats token and the original scaling of the base nodes set to zero."""

    graph_name: str | None = None
    graph_version: str | None = None
    live: Route | None = None
    canary: Route | None = None
    stats: str | None = None
    scaled: Mapping[str, Any] = field(default_factory=dict)

    def route(self, name: str | None) -> Route | None:
        """The route a request's `ROUTE_HEADER` names (absent or unknown: live)."""
        return self.canary if name == CANARY else self.live


# -- encoding: the renderer's side ------------------------------------------------


def encode_route(route: Route) -> dict[str, Any]:
    """A route as its `user_config` entry; keys in a fixed order, defaults left out."""
    out: dict[str, Any] = {"version": route.version}
    if route.app is not None:
        out["app"] = route.app
    if route.nodes:
        out["nodes"] = sorted(route.nodes)
    if route.weight:
        out["weight"] = route.weight
    if route.mirror:
        out["mirror"] = route.mirror
        out["busy"] = route.busy
    if route.sticky is not None:
        out["sticky"] = {"header": route.sticky.header} if route.sticky.header else {"field": route.sticky.field}
    return out


def encode_settings(
    user_config: Mapping[str, Any] | None,
    live: Route | None,
    canary: Route | None,
    stats: str | None = None,
    scaled: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """`user_config` (a router's, as rendered) with these routes; without any, as rendered."""
    outer = dict(user_config or {})
    inner = {k: v for k, v in dict(outer.get(ROUTER_CONFIG_KEY) or {}).items() if k in ("graph",)}
    routes = {name: encode_route(r) for name, r in ((LIVE, live), (CANARY, canary)) if r is not None}
    if routes:
        inner["routes"] = routes
    if stats:
        inner["stats"] = stats
    if scaled:
        inner["scaled"] = {k: scaled[k] for k in sorted(scaled)}
    outer[ROUTER_CONFIG_KEY] = inner
    return outer


def without_settings(user_config: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """`user_config` as rendered: routes, stats and scaled taken out."""
    if not isinstance(user_config, Mapping):
        return None
    return encode_settings(user_config, None, None)


# -- decoding: the runtime's side --------------------------------------------------


def decode_settings(user_config: Any) -> Settings:
    """A router's `user_config` as Settings, or SettingsError naming every problem.

    Lenient about what it does not own (other keys of `user_config`), strict about the
    routes: a route the runtime misread would send requests to the wrong version."""
    inner = user_config.get(ROUTER_CONFIG_KEY) if isinstance(user_config, Mapping) else None
    if not isinstance(inner, Mapping):
        return Settings()
    problems: list[str] = []
    name, version = graph_identity(user_config)
    raw_routes = inner.get("routes", {})
    routes: dict[str, Route] = {}
    if not isinstance(raw_routes, Mapping):
        problems.append("routes: must be a mapping of live and canary")
        raw_routes = {}
    for key, raw in raw_routes.items():
        if key not in ROUTE_NAMES:
            problems.append(f"routes: unknown route {key!r} (expected live or canary)")
            continue
        route = _decode_route(problems, f"routes.{key}", raw, canary=key == CANARY)
        if route is not None:
            routes[key] = route
    stats = inner.get("stats")
    if stats is not None and (not isinstance(stats, str) or not 0 < len(stats) <= MAX_TOKEN):
        problems.append(f"stats: must be a token of 1 to {MAX_TOKEN} characters")
        stats = None
    scaled = inner.get("scaled", {})
    if not isinstance(scaled, Mapping):
        problems.append("scaled: must be a mapping of node id to its autoscaling_config")
        scaled = {}
    if problems:
        raise SettingsError([f"user_config.{ROUTER_CONFIG_KEY}.{p}" for p in problems])
    return Settings(name, version, routes.get(LIVE), routes.get(CANARY), stats, dict(scaled))


def graph_identity(user_config: Any) -> tuple[str | None, str | None]:
    """The graph's name and version from a router's `user_config` (None where absent)."""
    inner = user_config.get(ROUTER_CONFIG_KEY) if isinstance(user_config, Mapping) else None
    raw = inner.get("graph") if isinstance(inner, Mapping) else None
    return identity(raw)


def identity(raw: Any) -> tuple[str | None, str | None]:
    """The graph's name and version, informational only: a config without them still builds."""
    if not isinstance(raw, Mapping):
        return None, None
    name, version = raw.get("name"), raw.get("version")
    return (name if isinstance(name, str) else None), (version if isinstance(version, str) else None)


def _percent(problems: list[str], where: str, raw: Mapping[str, Any], key: str) -> int:
    value = raw.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_PERCENT:
        problems.append(f"{where}.{key}: must be a whole percent from 0 to {MAX_PERCENT}, got {value!r}")
        return 0
    return value


def _decode_route(problems: list[str], where: str, raw: Any, canary: bool) -> Route | None:
    if not isinstance(raw, Mapping):
        problems.append(f"{where}: must be a mapping")
        return None
    allowed = {"version", "app", "nodes"} | ({"weight", "mirror", "busy", "sticky"} if canary else set())
    before = len(problems)
    problems.extend(f"{where}: unknown key {k!r}" for k in raw if k not in allowed)
    version, app, nodes = raw.get("version"), raw.get("app"), raw.get("nodes", [])
    if not isinstance(version, str) or not version:
        problems.append(f"{where}.version: must be the version's name")
    if app is not None and (not isinstance(app, str) or not app):
        problems.append(f"{where}.app: must be the side application's name")
    if not isinstance(nodes, list) or not all(isinstance(n, str) and n for n in nodes):
        problems.append(f"{where}.nodes: must be a list of node ids")
        nodes = []
    if nodes and app is None:
        problems.append(f"{where}.nodes: needs the side application (app) that holds them")
    weight, mirror = _percent(problems, where, raw, "weight"), _percent(problems, where, raw, "mirror")
    busy = raw.get("busy", 0)
    if isinstance(busy, bool) or not isinstance(busy, int) or busy < 0:
        problems.append(f"{where}.busy: must be a count of requests, got {busy!r}")
        busy = 0
    sticky = _decode_sticky(problems, f"{where}.sticky", raw.get("sticky"))
    if len(problems) > before:
        return None
    return Route(str(version), app, frozenset(nodes), weight, mirror, busy, sticky)


def _decode_sticky(problems: list[str], where: str, raw: Any) -> Sticky | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or len(raw) != 1 or not set(raw) <= {"header", "field"}:
        problems.append(f"{where}: must be {{header: NAME}} or {{field: NAME}}")
        return None
    ((key, value),) = raw.items()
    if not isinstance(value, str) or not value or len(value) > MAX_TOKEN:
        problems.append(f"{where}.{key}: must be a name of 1 to {MAX_TOKEN} characters")
        return None
    return Sticky(header=value.lower()) if key == "header" else Sticky(field=value)
