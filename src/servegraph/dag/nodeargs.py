"""One node's entry in the runtime's args, both ways: `encode_node` and `decode_node`.

The other half of `servegraph.dag.args` (which holds the application-level format and
re-exports what is public here), split off so each half reads on its own. An edge
is written as the child's id, or, when the graph says how to call it, as a mapping
`{node, timeout_s, retries, optional}` with only the keys that differ from a plain
call: graphs without call options render exactly as before, so upgrading servegraph
does not change (and make KubeRay re-push) the serveConfigV2 of a running graph.
Decoding checks only what the args' own format can get wrong (a type, a key); what a
node may say is `servegraph.dag.rules`, the validator's rules too. Standard library
only: this runs in the Ray image.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, assert_never

from servegraph.dag.model import (
    DEFAULT_CALL,
    MAX_RETRIES,
    Argument,
    BoundNode,
    Call,
    Constant,
    DeploymentKind,
    EnsembleKind,
    Node,
    NodeKind,
    SequenceKind,
    SplitterKind,
    SwitchKind,
)
from servegraph.dag.rules import node_problems

ROUTER_KINDS = ("sequence", "ensemble", "switch", "splitter")
NODE_KINDS = ("deployment", *ROUTER_KINDS)
CALL_KEYS = ("timeout_s", "retries", "optional")


class Problems:
    """Collects every problem of a decode, so the builder reports them all at once
    (`servegraph.dag.args.BuildError` carries them to Serve)."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def add(self, problem: str) -> None:
        self.problems.append(problem)

    def unknown_keys(self, where: str, raw: Mapping[str, Any], allowed: set[str]) -> None:
        for key in raw:
            if key not in allowed:
                self.add(f"{where}: unknown key {key!r} (expected one of {', '.join(sorted(allowed))})")

    def node_id(self, where: str, value: Any) -> str | None:
        """A node id as the args can get it wrong: not a string. Whether it names a node is
        the rules' (an empty one is their "empty node reference")."""
        if isinstance(value, str):
            return value
        self.add(f"{where}: must be a node id (a string), got {value!r}")
        return None


# -- encoding: the renderer's side ------------------------------------------------


def encode_node(node: Node) -> dict[str, Any]:
    """What to build for one node and what to bind into it."""
    kind = node.kind
    body: dict[str, Any]
    match kind:
        case DeploymentKind():
            body = {"import_path": kind.import_path}
            if kind.streaming:
                body["streaming"] = True
            if kind.args:
                body["args"] = [_encode_argument(a) for a in kind.args]
            if kind.kwargs:
                body["kwargs"] = {k: _encode_argument(v) for k, v in kind.kwargs}
            return {"id": node.id, "deployment": body}
        case SequenceKind():
            return {"id": node.id, "sequence": {"steps": [_edge(s, kind.call(i)) for i, s in enumerate(kind.steps)]}}
        case EnsembleKind():
            body = {"members": [_edge(m, kind.call(i)) for i, m in enumerate(kind.members)]}
            if kind.combiner:
                body["combiner"] = _edge(kind.combiner, kind.call(len(kind.members)))
            return {"id": node.id, "ensemble": body}
        case SwitchKind():
            body = {"field": kind.field} if kind.field is not None else {"header": kind.header}
            body["cases"] = [{"equals": v, "node": n, **_call(kind.call(i))} for i, (v, n) in enumerate(kind.cases)]
            body["default"] = _edge(kind.default, kind.call(len(kind.cases)))
            return {"id": node.id, "switch": body}
        case SplitterKind():
            routes = [{"node": n, "weight": w, **_call(kind.call(i))} for i, (n, w) in enumerate(kind.routes)]
            return {"id": node.id, "splitter": {"routes": routes}}
        case _:
            assert_never(kind)


def _call(call: Call) -> dict[str, Any]:
    """The keys of a Call that differ from a plain call, in a fixed order."""
    out: dict[str, Any] = {}
    if call.timeout_s is not None:
        out["timeout_s"] = call.timeout_s
    if call.retries:
        out["retries"] = call.retries
    if call.optional:
        out["optional"] = True
    return out


def _edge(node_id: str, call: Call) -> str | dict[str, Any]:
    return node_id if call == DEFAULT_CALL else {"node": node_id, **_call(call)}


def _encode_argument(arg: Argument) -> dict[str, Any]:
    if isinstance(arg, BoundNode):
        return {"node": arg.node}
    return {"value": arg.value}


# -- decoding: the builder's side -------------------------------------------------


def decode_node(p: Problems, where: str, raw: Any) -> Node | None:
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
    name = kinds[0]
    body = raw[name]
    if not isinstance(body, Mapping):
        p.add(f"{where}, field {name}: must be a mapping, got {type(body).__name__}")
        return None
    before = len(p.problems)
    kind = _DECODERS[name](p, where, body)
    # The rules judge the kind once it reads: a part the args got wrong is left out of it,
    # and judging what is left would only add noise (a sum without the unreadable weight).
    for field, problem in node_problems(node_id, kind if len(p.problems) == before else None):
        p.add(f"{where}, field {field}: {problem}" if field else f"{where}: {problem}")
    return Node(id=node_id, kind=kind) if len(p.problems) == before else None


def decode_call(p: Problems, where: str, raw: Mapping[str, Any]) -> Call:
    """The call options of one edge (`where` names it), as the graph schema has them: a
    timeout of 0 is none. Their values are the rules' to judge."""
    timeout = raw.get("timeout_s")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)):
        p.add(f"{where}.timeout_s: must be a number of seconds, got {timeout!r}")
        timeout = None
    retries = raw.get("retries", 0)
    if isinstance(retries, bool) or not isinstance(retries, int):
        p.add(f"{where}.retries: must be an integer from 0 to {MAX_RETRIES}, got {retries!r}")
        retries = 0
    optional = raw.get("optional", False)
    if not isinstance(optional, bool):
        p.add(f"{where}.optional: must be true or false, got {optional!r}")
        optional = False
    return Call(timeout_s=float(timeout) if timeout else None, retries=retries, optional=optional)


def _decode_edge(p: Problems, where: str, raw: Any) -> tuple[str | None, Call]:
    """An edge: a node id, or a mapping of the node id and its call options."""
    if not isinstance(raw, Mapping):
        return p.node_id(where, raw), DEFAULT_CALL
    p.unknown_keys(where, raw, {"node", *CALL_KEYS})
    return p.node_id(f"{where}.node", raw.get("node")), decode_call(p, where, raw)


def _decode_deployment(p: Problems, where: str, body: Mapping[str, Any]) -> NodeKind:
    p.unknown_keys(f"{where}, field deployment", body, {"import_path", "args", "kwargs", "streaming"})
    streaming = body.get("streaming", False)
    if not isinstance(streaming, bool):
        p.add(f"{where}, field deployment.streaming: must be true or false, got {streaming!r}")
        streaming = False
    import_path = body.get("import_path", "")
    if not isinstance(import_path, str):
        p.add(f"{where}, field deployment.import_path: must be a 'module.path:attribute' string, got {import_path!r}")
        import_path = ""
    raw_args = body.get("args", [])
    raw_kwargs = body.get("kwargs", {})
    args: list[Argument] = []
    kwargs: list[tuple[str, Argument]] = []
    if not isinstance(raw_args, list):
        p.add(f"{where}, field deployment.args: must be a list")
    else:
        for i, a in enumerate(raw_args):
            arg = _decode_argument(p, f"{where}, field deployment.args[{i}]", a)
            if arg is not None:
                args.append(arg)
    if not isinstance(raw_kwargs, Mapping):
        p.add(f"{where}, field deployment.kwargs: must be a mapping")
    else:
        for k, a in raw_kwargs.items():
            if not isinstance(k, str):
                p.add(f"{where}, field deployment.kwargs: {k!r} is not a keyword argument name (a string)")
                continue
            arg = _decode_argument(p, f"{where}, field deployment.kwargs[{k!r}]", a)
            if arg is not None:
                kwargs.append((k, arg))
    return DeploymentKind(import_path=import_path, args=tuple(args), kwargs=tuple(kwargs), streaming=streaming)


def _decode_argument(p: Problems, where: str, raw: Any) -> Argument | None:
    if isinstance(raw, Mapping) and len(raw) == 1:
        if "value" in raw:
            return Constant(raw["value"])
        if "node" in raw:
            ref = p.node_id(f"{where}.node", raw["node"])
            return None if ref is None else BoundNode(ref)
    p.add(f"{where}: must be {{value: <literal>}} or {{node: <node id>}}, got {raw!r}")
    return None


def _edge_list(p: Problems, where: str, raw: Any) -> tuple[tuple[str, ...], list[Call]]:
    if not isinstance(raw, list):
        p.add(f"{where}: must be a list of node ids")
        return (), []
    edges = [_decode_edge(p, f"{where}[{i}]", v) for i, v in enumerate(raw)]
    kept = [(i, c) for i, c in edges if i is not None]
    return tuple(i for i, _ in kept), [c for _, c in kept]


def _decode_sequence(p: Problems, where: str, body: Mapping[str, Any]) -> NodeKind:
    p.unknown_keys(f"{where}, field sequence", body, {"steps"})
    steps, calls = _edge_list(p, f"{where}, field sequence.steps", body.get("steps", []))
    return SequenceKind(steps=steps, calls=tuple(calls))


def _decode_ensemble(p: Problems, where: str, body: Mapping[str, Any]) -> NodeKind:
    p.unknown_keys(f"{where}, field ensemble", body, {"members", "combiner"})
    members, calls = _edge_list(p, f"{where}, field ensemble.members", body.get("members", []))
    combiner = None
    if body.get("combiner") is not None:
        combiner, call = _decode_edge(p, f"{where}, field ensemble.combiner", body["combiner"])
        calls.append(call)
    return EnsembleKind(members=members, combiner=combiner, calls=tuple(calls))


def _decode_switch(p: Problems, where: str, body: Mapping[str, Any]) -> NodeKind:
    p.unknown_keys(f"{where}, field switch", body, {"field", "header", "cases", "default"})
    field, header = body.get("field"), body.get("header")
    for name, value in (("field", field), ("header", header)):
        if value is not None and not isinstance(value, str):
            p.add(f"{where}, field switch.{name}: must be a string, got {value!r}")
    cases: list[tuple[str, str]] = []
    calls: list[Call] = []
    raw_cases = body.get("cases", [])
    if not isinstance(raw_cases, list):
        p.add(f"{where}, field switch.cases: must be a list")
        raw_cases = []
    for i, case in enumerate(raw_cases):
        cw = f"{where}, field switch.cases[{i}]"
        if not isinstance(case, Mapping):
            p.add(f"{cw}: must be a mapping with equals and node")
            continue
        p.unknown_keys(cw, case, {"equals", "node", *CALL_KEYS})
        equals = case.get("equals")
        if not isinstance(equals, str):
            p.add(f"{cw}.equals: must be a string, got {equals!r}")
        target = p.node_id(f"{cw}.node", case.get("node"))
        call = decode_call(p, cw, case)
        if isinstance(equals, str) and target is not None:
            cases.append((equals, target))
            calls.append(call)
    raw_default = body.get("default")
    default, call = (
        ("", DEFAULT_CALL) if raw_default is None else _decode_edge(p, f"{where}, field switch.default", raw_default)
    )
    return SwitchKind(
        cases=tuple(cases),
        default=default or "",
        field=field if isinstance(field, str) else None,
        header=header.lower() if isinstance(header, str) else None,  # as the validator keeps it
        calls=(*calls, call),
    )


def _decode_splitter(p: Problems, where: str, body: Mapping[str, Any]) -> NodeKind:
    p.unknown_keys(f"{where}, field splitter", body, {"routes"})
    raw_routes = body.get("routes", [])
    routes: list[tuple[str, int]] = []
    calls: list[Call] = []
    if not isinstance(raw_routes, list):
        p.add(f"{where}, field splitter.routes: must be a list")
        raw_routes = []
    for i, route in enumerate(raw_routes):
        rw = f"{where}, field splitter.routes[{i}]"
        if not isinstance(route, Mapping):
            p.add(f"{rw}: must be a mapping with node and weight")
            continue
        p.unknown_keys(rw, route, {"node", "weight", *CALL_KEYS})
        target = p.node_id(f"{rw}.node", route.get("node"))
        weight = route.get("weight")
        call = decode_call(p, rw, route)
        if isinstance(weight, bool) or not isinstance(weight, int):
            p.add(f"{rw}.weight: must be an integer, got {weight!r}")
        elif target is not None:
            routes.append((target, weight))
            calls.append(call)
    return SplitterKind(routes=tuple(routes), calls=tuple(calls))


_DECODERS: dict[str, Callable[[Problems, str, Mapping[str, Any]], NodeKind]] = {
    "deployment": _decode_deployment,
    "sequence": _decode_sequence,
    "ensemble": _decode_ensemble,
    "switch": _decode_switch,
    "splitter": _decode_splitter,
}
