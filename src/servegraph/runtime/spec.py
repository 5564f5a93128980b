"""The application builder's `args`, parsed and checked before anything is imported.

The renderer validates graphs, but the builder still receives whatever a Serve
config says — possibly hand-written, possibly from a newer renderer than the
runtime in the image — so it re-checks the shape and reports every problem at
once, each naming its node. Pure: no Ray, no imports of user code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias


class BuildError(ValueError):
    """The args cannot become a Serve application; `str()` lists every problem, one a line.

    A ValueError so Serve reports it as the application's DEPLOY_FAILED message.
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass(frozen=True)
class Literal:
    value: Any


@dataclass(frozen=True)
class Ref:
    node: str


Arg: TypeAlias = Literal | Ref


@dataclass(frozen=True)
class DeploymentNode:
    id: str
    import_path: str
    args: tuple[Arg, ...] = ()
    kwargs: tuple[tuple[str, Arg], ...] = ()

    def refs(self) -> list[tuple[str, str]]:
        """(where, node id) of each edge, for error messages and ordering checks."""
        out = [(f"deployment.args[{i}].node", a.node) for i, a in enumerate(self.args) if isinstance(a, Ref)]
        out += [(f"deployment.kwargs.{k}.node", a.node) for k, a in self.kwargs if isinstance(a, Ref)]
        return out


@dataclass(frozen=True)
class SequenceNode:
    id: str
    steps: tuple[str, ...]

    def refs(self) -> list[tuple[str, str]]:
        return [(f"sequence.steps[{i}]", s) for i, s in enumerate(self.steps)]


@dataclass(frozen=True)
class EnsembleNode:
    id: str
    members: tuple[str, ...]
    combiner: str | None = None

    def refs(self) -> list[tuple[str, str]]:
        out = [(f"ensemble.members[{i}]", m) for i, m in enumerate(self.members)]
        if self.combiner is not None:
            out.append(("ensemble.combiner", self.combiner))
        return out


@dataclass(frozen=True)
class SwitchNode:
    id: str
    cases: tuple[tuple[str, str], ...]
    default: str
    field: str | None = None
    header: str | None = None

    def refs(self) -> list[tuple[str, str]]:
        out = [(f"switch.cases[{i}].node", n) for i, (_, n) in enumerate(self.cases)]
        return [*out, ("switch.default", self.default)]


@dataclass(frozen=True)
class SplitterNode:
    id: str
    routes: tuple[tuple[str, int], ...]

    def refs(self) -> list[tuple[str, str]]:
        return [(f"splitter.routes[{i}].node", n) for i, (n, _) in enumerate(self.routes)]


Node: TypeAlias = DeploymentNode | SequenceNode | EnsembleNode | SwitchNode | SplitterNode
ROUTER_KINDS = ("sequence", "ensemble", "switch", "splitter")
NODE_KINDS = ("deployment", *ROUTER_KINDS)


@dataclass(frozen=True)
class AppSpec:
    ingress: str
    nodes: tuple[Node, ...]


def parse_args(args: Mapping[str, Any]) -> AppSpec:
    """Turn the builder's args into an AppSpec or raise BuildError naming every problem."""
    p = _Problems()
    if not isinstance(args, Mapping):
        raise BuildError([f"args: must be a mapping, got {type(args).__name__}"])
    p.unknown_keys("args", args, {"graph", "ingress", "nodes"})
    ingress = args.get("ingress")
    if not isinstance(ingress, str) or not ingress:
        p.add("args.ingress: must be a non-empty node id")
    raw_nodes = args.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        p.add("args.nodes: must be a non-empty list")
        raw_nodes = []

    nodes: list[Node] = []
    defined: set[str] = set()
    all_ids = {i for i in map(_id_of, raw_nodes) if isinstance(i, str)}
    for i, raw in enumerate(raw_nodes):
        node = _parse_node(p, f"args.nodes[{i}]", raw)
        if node is None:
            continue
        if node.id in defined:
            p.add(f'node "{node.id}": defined twice')
            continue
        for where, ref in node.refs():
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

    if isinstance(ingress, str) and ingress and raw_nodes and ingress not in defined:
        p.add(f'args.ingress: unknown node "{ingress}"')
    elif isinstance(ingress, str) and ingress in defined and not p.problems:
        # Serve deploys only what the ingress reaches; a config entry for any
        # other node would fail later with a less helpful message.
        for node_id in sorted(defined - _reachable(nodes, ingress)):
            p.add(f'node "{node_id}": not reachable from the ingress "{ingress}"; Serve would not deploy it')
    p.raise_if_any()
    assert isinstance(ingress, str)
    return AppSpec(ingress=ingress, nodes=tuple(nodes))


def _id_of(raw: Any) -> Any:
    return raw.get("id") if isinstance(raw, Mapping) else None


def _reachable(nodes: list[Node], ingress: str) -> set[str]:
    by_id = {n.id: n for n in nodes}
    seen: set[str] = set()
    todo = [ingress]
    while todo:
        node_id = todo.pop()
        if node_id in seen:
            continue
        seen.add(node_id)
        todo.extend(ref for _, ref in by_id[node_id].refs())
    return seen


class _Problems:
    def __init__(self) -> None:
        self.problems: list[str] = []

    def add(self, problem: str) -> None:
        self.problems.append(problem)

    def unknown_keys(self, where: str, raw: Mapping[str, Any], allowed: set[str]) -> None:
        for key in raw:
            if key not in allowed:
                self.add(f"{where}: unknown key {key!r} (expected one of {', '.join(sorted(allowed))})")

    def node_id(self, where: str, value: Any) -> str | None:
        if isinstance(value, str) and value:
            return value
        self.add(f"{where}: must be a non-empty node id, got {value!r}")
        return None

    def raise_if_any(self) -> None:
        if self.problems:
            raise BuildError(self.problems)


def _parse_node(p: _Problems, where: str, raw: Any) -> Node | None:
    if not isinstance(raw, Mapping):
        p.add(f"{where}: must be a mapping, got {type(raw).__name__}")
        return None
    node_id = p.node_id(f"{where}.id", raw.get("id"))
    if node_id is None:
        return None
    where = f'node "{node_id}"'
    p.unknown_keys(where, raw, {"id", *NODE_KINDS})
    kinds = [k for k in NODE_KINDS if k in raw]
    if len(kinds) != 1:
        p.add(f"{where}: must have exactly one of {', '.join(NODE_KINDS)}, got {kinds or 'none'}")
        return None
    kind = kinds[0]
    body = raw[kind]
    if not isinstance(body, Mapping):
        p.add(f"{where}, field {kind}: must be a mapping, got {type(body).__name__}")
        return None
    before = len(p.problems)
    node = _PARSERS[kind](p, where, node_id, body)
    return node if len(p.problems) == before else None


def _parse_deployment(p: _Problems, where: str, node_id: str, body: Mapping[str, Any]) -> Node:
    p.unknown_keys(f"{where}, field deployment", body, {"import_path", "args", "kwargs"})
    import_path = body.get("import_path")
    if not isinstance(import_path, str) or not import_path:
        p.add(f"{where}, field deployment.import_path: must be a non-empty 'module:attribute' string")
        import_path = ""
    raw_args = body.get("args", [])
    raw_kwargs = body.get("kwargs", {})
    args: list[Arg] = []
    kwargs: list[tuple[str, Arg]] = []
    if not isinstance(raw_args, list):
        p.add(f"{where}, field deployment.args: must be a list")
    else:
        for i, a in enumerate(raw_args):
            arg = _parse_arg(p, f"{where}, field deployment.args[{i}]", a)
            if arg is not None:
                args.append(arg)
    if not isinstance(raw_kwargs, Mapping):
        p.add(f"{where}, field deployment.kwargs: must be a mapping")
    else:
        for k, a in raw_kwargs.items():
            if not isinstance(k, str) or not k.isidentifier():
                p.add(f"{where}, field deployment.kwargs: {k!r} is not a valid keyword argument name")
                continue
            arg = _parse_arg(p, f"{where}, field deployment.kwargs.{k}", a)
            if arg is not None:
                kwargs.append((k, arg))
    return DeploymentNode(id=node_id, import_path=import_path, args=tuple(args), kwargs=tuple(kwargs))


def _parse_arg(p: _Problems, where: str, raw: Any) -> Arg | None:
    if isinstance(raw, Mapping) and len(raw) == 1:
        if "value" in raw:
            return Literal(raw["value"])
        if "node" in raw:
            ref = p.node_id(f"{where}.node", raw["node"])
            return None if ref is None else Ref(ref)
    p.add(f"{where}: must be {{value: <literal>}} or {{node: <node id>}}, got {raw!r}")
    return None


def _id_list(p: _Problems, where: str, raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw:
        p.add(f"{where}: must be a non-empty list of node ids")
        return ()
    ids = [p.node_id(f"{where}[{i}]", v) for i, v in enumerate(raw)]
    return tuple(i for i in ids if i is not None)


def _parse_sequence(p: _Problems, where: str, node_id: str, body: Mapping[str, Any]) -> Node:
    p.unknown_keys(f"{where}, field sequence", body, {"steps"})
    return SequenceNode(id=node_id, steps=_id_list(p, f"{where}, field sequence.steps", body.get("steps")))


def _parse_ensemble(p: _Problems, where: str, node_id: str, body: Mapping[str, Any]) -> Node:
    p.unknown_keys(f"{where}, field ensemble", body, {"members", "combiner"})
    members = _id_list(p, f"{where}, field ensemble.members", body.get("members"))
    if len(set(members)) != len(members):
        p.add(f"{where}, field ensemble.members: a member is listed twice (results are keyed by member id)")
    combiner = body.get("combiner")
    if combiner is not None:
        combiner = p.node_id(f"{where}, field ensemble.combiner", combiner)
    return EnsembleNode(id=node_id, members=members, combiner=combiner)


def _parse_switch(p: _Problems, where: str, node_id: str, body: Mapping[str, Any]) -> Node:
    p.unknown_keys(f"{where}, field switch", body, {"field", "header", "cases", "default"})
    field, header = body.get("field"), body.get("header")
    if (field is None) == (header is None):
        p.add(f"{where}, field switch: must have exactly one of field, header")
    for name, value in (("field", field), ("header", header)):
        if value is not None and (not isinstance(value, str) or not value):
            p.add(f"{where}, field switch.{name}: must be a non-empty string")
    cases: list[tuple[str, str]] = []
    raw_cases = body.get("cases", [])
    if not isinstance(raw_cases, list):
        p.add(f"{where}, field switch.cases: must be a list")
        raw_cases = []
    for i, case in enumerate(raw_cases):
        cw = f"{where}, field switch.cases[{i}]"
        if not isinstance(case, Mapping):
            p.add(f"{cw}: must be a mapping with equals and node")
            continue
        p.unknown_keys(cw, case, {"equals", "node"})
        equals = case.get("equals")
        if not isinstance(equals, str):
            p.add(f"{cw}.equals: must be a string, got {equals!r}")
        target = p.node_id(f"{cw}.node", case.get("node"))
        if isinstance(equals, str) and target is not None:
            cases.append((equals, target))
    default = p.node_id(f"{where}, field switch.default", body.get("default"))
    return SwitchNode(
        id=node_id,
        cases=tuple(cases),
        default=default or "",
        field=field if isinstance(field, str) else None,
        header=header if isinstance(header, str) else None,
    )


def _parse_splitter(p: _Problems, where: str, node_id: str, body: Mapping[str, Any]) -> Node:
    p.unknown_keys(f"{where}, field splitter", body, {"routes"})
    raw_routes = body.get("routes")
    routes: list[tuple[str, int]] = []
    if not isinstance(raw_routes, list) or not raw_routes:
        p.add(f"{where}, field splitter.routes: must be a non-empty list")
        raw_routes = []
    for i, route in enumerate(raw_routes):
        rw = f"{where}, field splitter.routes[{i}]"
        if not isinstance(route, Mapping):
            p.add(f"{rw}: must be a mapping with node and weight")
            continue
        p.unknown_keys(rw, route, {"node", "weight"})
        target = p.node_id(f"{rw}.node", route.get("node"))
        weight = route.get("weight")
        if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
            p.add(f"{rw}.weight: must be a non-negative integer, got {weight!r}")
        elif target is not None:
            routes.append((target, weight))
    total = sum(w for _, w in routes)
    if len(routes) == len(raw_routes) and routes and total != 100:
        p.add(f"{where}, field splitter.routes: weights must sum to 100, got {total}")
    return SplitterNode(id=node_id, routes=tuple(routes))


_PARSERS = {
    "deployment": _parse_deployment,
    "sequence": _parse_sequence,
    "ensemble": _parse_ensemble,
    "switch": _parse_switch,
    "splitter": _parse_splitter,
}
