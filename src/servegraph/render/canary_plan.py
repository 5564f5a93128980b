"""Which nodes of a new version must run as copies beside the base's, per application (pure).

Ray Serve 2.60 gives every deployment of an application one code version, a hash of the
application's `import_path`, `runtime_env` and `args` — and of the `policy` of every
deployment's `autoscaling_config` (`deploy_utils.get_app_code_version`): any change to
them restarts every replica of the application. So a canary never rebuilds the base
application: the new version's nodes that differ run as copies in a side application,
and the base's routers call them there (`render/canary.py` lays the two out). A node is
copied iff its own definition differs from the base's (or it is new), or it has a copied
descendant and it is user code (its handles are bound at construction, it cannot be
redirected), or it has a copied descendant and a copied parent (the copy calls it, and
user code passes no route on).

A node's definition is its args entry, its deployment options (a router's `user_config`
is servegraph's own and left out) and whether its output and each child's output stream
(how its parent calls it, and how it calls its children).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from servegraph.dag.args import BuildError, decode
from servegraph.dag.model import DeploymentKind
from servegraph.dag.streams import streaming_outputs

INGRESS_CHANGED = "IngressChanged"
APPLICATION_ADDED = "ApplicationAdded"
APPLICATION_REMOVED = "ApplicationRemoved"
APPLICATION_CHANGED = "ApplicationChanged"
SERVE_OPTIONS_CHANGED = "ServeOptionsChanged"
NOT_READY = "BaseNotReady"
REASONS = (
    INGRESS_CHANGED,
    APPLICATION_ADDED,
    APPLICATION_REMOVED,
    APPLICATION_CHANGED,
    SERVE_OPTIONS_CHANGED,
    NOT_READY,
)
"""Why a version cannot be canaried beside the base (a condition's reason, CamelCase)."""


@dataclass(frozen=True)
class Copies:
    """What running a new version beside the base takes, for one application.

    `nodes`: the copies, in topological order; `targets`: the copies a base router calls
    instead of its own child (the route's redirects); `side`: the copies and every node
    below them, in topological order (what the side application's args list); `unused`:
    the base's nodes the new version does not use.
    """

    app: str
    nodes: tuple[str, ...] = ()
    targets: frozenset[str] = frozenset()
    side: tuple[str, ...] = ()
    unused: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Refusal:
    """Why the version cannot run beside the base: `reason` is one of REASONS."""

    app: str | None
    reason: str
    message: str


class CanaryRefused(ValueError):
    """A layout was asked for a version `plan` refuses."""

    def __init__(self, refusal: Refusal) -> None:
        self.refusal = refusal
        super().__init__(refusal.message)


def ready(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` with every deployment's replicas as an `autoscaling_config`: a fixed count
    `n` becomes min = max = initial = n (the same replicas).

    Needed from the base's first deploy on: Serve hashes the number of deployments that
    have an `autoscaling_config` into the code version, so giving one to a deployment that
    had none would restart the whole application; with one already, scaling an unused base
    node to zero (and back) is a deployment option change that restarts nothing.
    """
    apps = [{**a, "deployments": [_ready(d) for d in a.get("deployments", [])]} for a in config["applications"]]
    return {**config, "applications": apps}


def _ready(deployment: Mapping[str, Any]) -> dict[str, Any]:
    if "autoscaling_config" in deployment:
        return dict(deployment)
    n = deployment.get("num_replicas", 1)
    if not isinstance(n, int):
        return dict(deployment)  # "auto": Serve gives it an autoscaling_config itself
    pinned = {"min_replicas": n, "max_replicas": n, "initial_replicas": n}
    out: dict[str, Any] = {}
    for key, value in deployment.items():
        out["autoscaling_config" if key == "num_replicas" else key] = pinned if key == "num_replicas" else value
    if "autoscaling_config" not in out:
        out["autoscaling_config"] = pinned
    return out


@dataclass(frozen=True)
class AppNodes:
    """One rendered application read for planning: its nodes' definitions and edges."""

    name: str
    ingress: str
    order: tuple[str, ...]
    entries: Mapping[str, Any]
    deployments: Mapping[str, Mapping[str, Any]]
    edges: Mapping[str, tuple[str, ...]]
    routers: frozenset[str]
    definitions: Mapping[str, str]

    @classmethod
    def of(cls, app: Mapping[str, Any]) -> AppNodes:
        args = app.get("args")
        name = str(app.get("name"))
        try:
            decoded = decode(args if isinstance(args, Mapping) else {})
        except BuildError as e:
            raise ValueError(f'application "{name}": its args do not decode: {e.problems[0]}') from None
        assert isinstance(args, Mapping)
        entries = {e["id"]: e for e in args["nodes"]}
        deployments = {d["name"]: d for d in app.get("deployments", []) if isinstance(d, Mapping)}
        order = tuple(n.id for n in decoded.nodes)
        kinds = {n.id: n.kind for n in decoded.nodes}
        edges = {n.id: n.edges for n in decoded.nodes}
        routers = frozenset(i for i, k in kinds.items() if not isinstance(k, DeploymentKind))
        streams = streaming_outputs(kinds, order)
        definitions = {
            i: _canonical(
                [
                    entries[i],
                    _options(deployments.get(i, {}), i in routers),
                    i in streams,
                    [c in streams for c in edges[i]],
                ]
            )
            for i in order
        }
        return cls(name, decoded.ingress, order, entries, deployments, edges, routers, definitions)

    def parents(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {i: [] for i in self.order}
        for parent in self.order:
            for child in self.edges[parent]:
                out[child].append(parent)
        return out

    def below(self, starts: Iterable[str]) -> set[str]:
        """`starts` and every node they reach."""
        seen: set[str] = set()
        todo = list(starts)
        while todo:
            node = todo.pop()
            if node not in seen:
                seen.add(node)
                todo.extend(self.edges[node])
        return seen


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _options(deployment: Mapping[str, Any], router: bool) -> dict[str, Any]:
    """A deployment's options as compared: replicas in the `ready` form, a router's user_config out."""
    out = {k: v for k, v in _ready(deployment).items() if k != "name" and not (router and k == "user_config")}
    return out


APP_SETTINGS = ("route_prefix", "import_path", "runtime_env")


def plan(base: Mapping[str, Any], new: Mapping[str, Any]) -> Copies | Refusal:
    """The copies `new` (a rendered application) needs beside `base` (the same application as
    the base version rendered it), or why it cannot run beside it."""
    name = str(base.get("name"))
    for key in APP_SETTINGS:
        if base.get(key) != new.get(key):
            return Refusal(
                name, APPLICATION_CHANGED, f'application "{name}": its {key} changed; only a rebuild applies it'
            )
    base_args, new_args = base.get("args") or {}, new.get("args") or {}
    for key in sorted(set(base_args) | set(new_args)):
        if key not in ("nodes", "ingress", "graph") and base_args.get(key) != new_args.get(key):
            return Refusal(
                name, APPLICATION_CHANGED, f'application "{name}": its {key} changed; only a rebuild applies it'
            )
    b, v = AppNodes.of(base), AppNodes.of(new)
    if b.ingress != v.ingress:
        return Refusal(
            name, INGRESS_CHANGED, f'application "{name}": its ingress changed from "{b.ingress}" to "{v.ingress}"'
        )
    copied = {i for i in v.order if b.definitions.get(i) != v.definitions[i]}
    parents = v.parents()
    while True:
        below: dict[str, bool] = {}
        for i in v.order:  # dependencies first
            below[i] = any(c in copied or below[c] for c in v.edges[i])
        more = {
            i
            for i in v.order
            if i not in copied and below[i] and (i not in v.routers or any(p in copied for p in parents[i]))
        }
        if not more:
            break
        copied |= more
    if v.ingress in copied:
        what = "router" if v.ingress in v.routers else "user code"
        why = "changed" if b.definitions.get(v.ingress) != v.definitions[v.ingress] else "calls a changed node"
        return Refusal(
            name,
            INGRESS_CHANGED,
            f'application "{name}": its ingress "{v.ingress}" ({what}) {why}, so both versions cannot share '
            "its route without an extra hop",
        )
    unused = frozenset(set(b.order) - (set(v.order) - copied))
    not_ready = sorted(i for i in unused if "autoscaling_config" not in b.deployments.get(i, {}))
    if not_ready:
        return Refusal(
            name,
            NOT_READY,
            f'application "{name}": the base deployed node "{not_ready[0]}" without an autoscaling_config, so it '
            "cannot be scaled to zero without restarting the application (deploy the base ready for canaries)",
        )
    targets = frozenset(c for c in copied if any(p not in copied for p in parents[c]))
    nodes = tuple(i for i in v.order if i in copied)
    side_set = v.below(nodes)
    return Copies(name, nodes, targets, tuple(layered(v.edges, side_set)), unused)


def plan_config(base: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Copies] | Refusal:
    """`plan` for every application of two rendered Serve configs, or the first refusal
    (applications added or removed, or Serve's own options changed, refuse the whole)."""
    for key in sorted((set(base) | set(new)) - {"applications"}):
        if base.get(key) != new.get(key):
            return Refusal(None, SERVE_OPTIONS_CHANGED, f"the Serve options' {key} changed; only a rebuild applies it")
    old = {a["name"]: a for a in base["applications"]}
    apps = {a["name"]: a for a in new["applications"]}
    for added in sorted(set(apps) - set(old)):
        return Refusal(added, APPLICATION_ADDED, f'application "{added}" is new; only a rebuild adds it')
    for removed in sorted(set(old) - set(apps)):
        return Refusal(removed, APPLICATION_REMOVED, f'application "{removed}" is gone; only a rebuild removes it')
    out: dict[str, Copies] = {}
    for name, app in old.items():
        planned = plan(app, apps[name])
        if isinstance(planned, Refusal):
            return planned
        out[name] = planned
    return out


def layered(edges: Mapping[str, Iterable[str]], nodes: Iterable[str]) -> list[str]:
    """`nodes` (closed under `edges`) dependencies first, each layer sorted by id: the
    renderer's order, so a subset listed here reads the same from any source."""
    keep = set(nodes)
    waiting = {n: len(set(edges[n])) for n in keep}
    dependents: dict[str, list[str]] = {n: [] for n in keep}
    for n in keep:
        for child in set(edges[n]):
            dependents[child].append(n)
    layer = sorted(n for n, w in waiting.items() if w == 0)
    order: list[str] = []
    while layer:
        order.extend(layer)
        next_layer = []
        for done in layer:
            for parent in dependents[done]:
                waiting[parent] -= 1
                if not waiting[parent]:
                    next_layer.append(parent)
        layer = sorted(next_layer)
    return order
