"""The runtime's arguments: how one application's DAG travels in a Serve config.

A Serve config can override options of deployments an application builds, but
cannot say who binds whom; so each application names `servegraph.runtime:build`
as its builder and carries its DAG in `args`. The renderer writes the args with
`encode` and the builder inside Ray reads them with `decode`: one codec, so the
format is defined in one place and a round trip gives back the same DAG.

`decode` re-checks everything, because the builder receives whatever a Serve
config says (possibly hand-written, possibly from a newer renderer than the
runtime in the image), and reports every problem at once, each naming its node.
One node's entry is in `servegraph.dag.nodeargs`; this module is the
application's format around it, and a canary's side application's (`encode_side`,
`decode_side`: one version's copies of the nodes that differ from the base's, with the
nodes below them); what a router's `user_config` says of a canary is
`servegraph.dag.routeargs`. Standard library only: this runs in the Ray image.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from servegraph.dag.model import Application, Graph, Node, Telemetry
from servegraph.dag.nodeargs import (
    NODE_KINDS,
    ROUTER_KINDS,
    Problems,
    decode_node,
    encode_node,
)
from servegraph.dag.routeargs import (
    CANARY,
    LIVE,
    PIN_ALIASES,
    ROUTE_HEADER,
    ROUTER_CONFIG_KEY,
    STATS_HEADER,
    VERSION_HEADER,
    Route,
    Settings,
    SettingsError,
    Sticky,
    decode_settings,
    encode_settings,
    graph_identity,
    identity,
    without_settings,
)
from servegraph.dag.rules import depth_problem, refs

__all__ = [
    "BUILDER",
    "CANARY",
    "HOLDER",
    "LIVE",
    "NODE_KINDS",
    "PIN_ALIASES",
    "ROUTER_CONFIG_KEY",
    "ROUTER_KINDS",
    "ROUTE_HEADER",
    "STATS_HEADER",
    "VERSION_HEADER",
    "AppArgs",
    "BuildError",
    "Route",
    "Settings",
    "SettingsError",
    "SideArgs",
    "Sticky",
    "decode",
    "decode_settings",
    "decode_side",
    "encode",
    "encode_node",
    "encode_settings",
    "encode_side",
    "graph_identity",
    "refs",
    "router_user_config",
    "without_settings",
]

BUILDER = "servegraph.runtime:build"
"""The `import_path` of every application servegraph renders."""


class BuildError(ValueError):
    """The args cannot become a Serve application; `str()` lists every problem, one a line.

    A ValueError so Serve reports it as the application's DEPLOY_FAILED message.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


_HEADER_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz")
"""RFC 9110 token characters, lower case: what a forwarded header's name may hold."""


@dataclass(frozen=True)
class AppArgs:
    """One application's DAG as the builder sees it.

    `nodes` are in topological order (dependencies first) and carry only their
    id and kind: replicas, resources and the other options travel in the Serve
    config's `deployments`, which Serve applies by deployment name = node id.
    `graph_name`/`graph_version` are read only from args written before they moved to
    the routers' `user_config` (see `router_user_config`).
    """

    ingress: str
    nodes: tuple[Node, ...]
    graph_name: str | None = None
    graph_version: str | None = None
    telemetry: Telemetry = field(default_factory=Telemetry)


# -- encoding: the renderer's side ------------------------------------------------


def encode(graph: Graph, app: Application) -> dict[str, Any]:
    """The `args` of one application; key order is fixed so the rendered YAML is stable.

    Only what the builder must bind is here. Serve gives every deployment of an
    application a new code version, and so restarts every replica, whenever the args
    change; what may change without a restart (the graph's version, which labels the
    routers' metrics) travels in `router_user_config` instead.
    """
    out: dict[str, Any] = {
        "ingress": app.ingress,
        "nodes": [encode_node(node) for node in app.ordered_nodes()],
    }
    telemetry = _encode_telemetry(app.telemetry)
    if telemetry:  # absent when default: older graphs render byte-identically
        out["telemetry"] = telemetry
    return out


def router_user_config(graph: Graph) -> dict[str, Any]:
    """A router deployment's `user_config`: the graph identity its metrics and spans carry.

    A `user_config` change reaches live replicas through `reconfigure`, so a publish
    that changes only the version restarts no replica (issue: every replica used to be
    replaced, because the version was in the args).
    """
    return {ROUTER_CONFIG_KEY: {"graph": {"name": graph.name, "version": graph.version}}}


HOLDER = "_servegraph_holder"
"""The deployment a side application's builder adds when its copies have several roots: it
binds them all (Serve deploys only what its ingress reaches) and answers no traffic. Not a
valid node id, so it cannot meet one."""


@dataclass(frozen=True)
class SideArgs:
    """A side application: one version's copies of the nodes that differ from the base's.

    `nodes` are the copies and every node below them, in topological order; the builder
    binds the `copies` in the side application and reaches each other node in the base
    application `app` by name. Its `roots` (copies no other copy calls) are what the side
    application's ingress binds: the root itself when there is one, else `HOLDER`.
    """

    app: str
    copies: frozenset[str]
    nodes: tuple[Node, ...]
    telemetry: Telemetry = field(default_factory=Telemetry)

    @property
    def roots(self) -> tuple[str, ...]:
        called = {ref for n in self.nodes if n.id in self.copies for _, ref in refs(n.kind)}
        return tuple(n.id for n in self.nodes if n.id in self.copies and n.id not in called)


def encode_side(app: str, copies: list[str], entries: list[Any], telemetry: Any = None) -> dict[str, Any]:
    """The `args` of a side application; `entries` are the nodes' args entries as the
    version's own args wrote them (see SideArgs), `telemetry` its args' telemetry entry."""
    out: dict[str, Any] = {"side": {"app": app, "copies": sorted(copies)}, "nodes": list(entries)}
    if telemetry:
        out["telemetry"] = telemetry
    return out


def decode_side(args: Mapping[str, Any]) -> SideArgs:
    """A side application's args as SideArgs, or BuildError naming every problem."""
    p = Problems()
    p.unknown_keys("args", args, {"side", "nodes", "telemetry"})
    side = args.get("side")
    if not isinstance(side, Mapping):
        raise BuildError(["args.side: must be a mapping of app and copies"])
    p.unknown_keys("args.side", side, {"app", "copies"})
    app, copies = side.get("app"), side.get("copies")
    if not isinstance(app, str) or not app:
        p.add("args.side.app: must be the base application's name")
    if not isinstance(copies, list) or not copies or not all(isinstance(c, str) for c in copies):
        p.add("args.side.copies: must be a non-empty list of node ids")
        copies = []
    raw_nodes = args.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        p.add("args.nodes: must be a non-empty list")
        raw_nodes = []
    nodes = _decode_nodes(p, raw_nodes)
    defined = {n.id for n in nodes}
    for copy in sorted(set(copies) - defined):
        p.add(f'args.side.copies: node "{copy}" is not among args.nodes')
    if not p.problems:
        for node_id in sorted(defined - _reachable(nodes, *copies)):
            p.add(f'node "{node_id}": below no copy; a side application lists only what its copies call')
    telemetry = _decode_telemetry(p, args.get("telemetry", {}))
    if p.problems:
        raise BuildError(p.problems)
    assert isinstance(app, str)
    return SideArgs(app=app, copies=frozenset(copies), nodes=tuple(nodes), telemetry=telemetry)


def _encode_telemetry(t: Telemetry) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if t.forward_headers:
        out["forward_headers"] = list(t.forward_headers)
    if not t.metrics:
        out["metrics"] = False
    return out


# -- decoding: the builder's side -------------------------------------------------


def decode(args: Mapping[str, Any]) -> AppArgs:
    """The builder's args as an AppArgs, or BuildError naming every problem."""
    p = Problems()
    if not isinstance(args, Mapping):
        raise BuildError([f"args: must be a mapping, got {type(args).__name__}"])
    p.unknown_keys("args", args, {"graph", "ingress", "nodes", "telemetry"})
    ingress = args.get("ingress")
    if not isinstance(ingress, str) or not ingress:
        p.add("args.ingress: must be a non-empty node id")
    raw_nodes = args.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        p.add("args.nodes: must be a non-empty list")
        raw_nodes = []

    nodes = _decode_nodes(p, raw_nodes)
    defined = {n.id for n in nodes}
    if isinstance(ingress, str) and ingress and raw_nodes and ingress not in defined:
        p.add(f'args.ingress: unknown node "{ingress}"')
    elif isinstance(ingress, str) and ingress in defined and not p.problems:
        # Serve deploys only what the ingress reaches; a config entry for any
        # other node would fail later with a less helpful message.
        for node_id in sorted(defined - _reachable(nodes, ingress)):
            p.add(f'node "{node_id}": not reachable from the ingress "{ingress}"; Serve would not deploy it')
        too_deep = depth_problem({n.id: n.edges for n in nodes}, [n.id for n in nodes], ingress)
        if too_deep is not None:
            p.add(f'node "{ingress}": {too_deep}')
    telemetry = _decode_telemetry(p, args.get("telemetry", {}))
    if p.problems:
        raise BuildError(p.problems)
    assert isinstance(ingress, str)
    name, version = identity(args.get("graph"))
    return AppArgs(ingress=ingress, nodes=tuple(nodes), graph_name=name, graph_version=version, telemetry=telemetry)


def _decode_nodes(p: Problems, raw_nodes: list[Any]) -> list[Node]:
    """Every node entry, each checked, and each reference to one listed before it."""
    nodes: list[Node] = []
    defined: set[str] = set()
    all_ids = {i for i in map(_id_of, raw_nodes) if isinstance(i, str)}
    for i, raw in enumerate(raw_nodes):
        node = decode_node(p, f"args.nodes[{i}]", raw)
        if node is None:
            continue
        if node.id in defined:
            p.add(f'node "{node.id}": defined twice')
            continue
        for where, ref in refs(node.kind):
            if ref == node.id:
                p.add(f'node "{node.id}", field {where}: refers to itself')
            elif ref not in all_ids:
                p.add(f'node "{node.id}", field {where}: unknown node "{ref}"')
            elif ref not in defined:
                p.add(
                    f'node "{node.id}", field {where}: node "{ref}" must be listed before '
                    "the nodes that use it (topological order)"
                )
        defined.add(node.id)
        nodes.append(node)
    return nodes


def _decode_telemetry(p: Problems, raw: Any) -> Telemetry:
    if not isinstance(raw, Mapping):
        p.add(f"args.telemetry: must be a mapping, got {type(raw).__name__}")
        return Telemetry()
    p.unknown_keys("args.telemetry", raw, {"forward_headers", "metrics"})
    headers = raw.get("forward_headers", [])
    names: list[str] = []
    if not isinstance(headers, list):
        p.add("args.telemetry.forward_headers: must be a list of header names")
        headers = []
    for i, name in enumerate(headers):
        if not isinstance(name, str) or not name or not set(name) <= _HEADER_CHARS:
            p.add(f"args.telemetry.forward_headers[{i}]: {name!r} is not a lower-case HTTP header name")
        else:
            names.append(name)
    metrics = raw.get("metrics", True)
    if not isinstance(metrics, bool):
        p.add(f"args.telemetry.metrics: must be true or false, got {metrics!r}")
        metrics = True
    return Telemetry(forward_headers=tuple(names), metrics=metrics)


def _id_of(raw: Any) -> Any:
    return raw.get("id") if isinstance(raw, Mapping) else None


def _reachable(nodes: list[Node], *starts: str) -> set[str]:
    by_id = {n.id: n for n in nodes}
    seen: set[str] = set()
    todo = list(starts)
    while todo:
        node_id = todo.pop()
        if node_id in seen:
            continue
        seen.add(node_id)
        todo.extend(ref for _, ref in refs(by_id[node_id].kind))
    return seen
