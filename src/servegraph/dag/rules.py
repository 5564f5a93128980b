"""The rules a node obeys, whichever format it came in (pure, standard library only).

A node reaches the model two ways: the validator reads it from the graph's protobuf
(`servegraph.graph.nodes`), the runtime's builder from a Serve config's args
(`servegraph.dag.nodeargs`). Each reader checks only what its own format can get wrong
(a wrong type, an unknown key, a value the model cannot hold) and builds the model;
both then ask `node_problems`. One rule set, so the operator never applies a node the
runtime refuses and a hand-written Serve config obeys what a published graph does
(tests/unit/test_node_rules.py holds the two readers to it). Fields are named as in
the graph schema (graph.proto), which the args mirror.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import assert_never

from servegraph.dag.model import (
    DEFAULT_CALL,
    MAX_RETRIES,
    BoundNode,
    DeploymentKind,
    EnsembleKind,
    NodeKind,
    RouterKind,
    SequenceKind,
    SplitterKind,
    SwitchKind,
)

NODE_ID = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
"""A deployment name Ray accepts: also the rule for application names."""
# `module.path:attr` or `module.attr`: the language of `ident(\.ident)*[:.]ident[\w.]*`,
# which on a failing match tries every split of the dots (32 KB took 7 s; 16 MB, hours).
IMPORT_PATH = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_.]*|(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_.]*)$"
)
MAX_IMPORT_PATH = 1024
SPLIT_TOTAL = 100

EMPTY_REF = "empty node reference"
BAD_ID = (
    "id is not a deployment name Ray accepts here: 1-63 letters, digits, '-', '_' or '.' (no '#'), "
    "starting and ending with a letter or digit"
)

Finding = tuple[str | None, str]
"""(field, or None for the node itself; what is wrong)."""


def node_problems(node_id: str, kind: NodeKind | None) -> list[Finding]:
    """Every rule the node breaks; its kind's only once the reader could build one."""
    found: list[Finding] = [] if NODE_ID.fullmatch(node_id) else [(None, BAD_ID)]
    match kind:
        case DeploymentKind():
            _deployment(kind, found)
        case SequenceKind():
            if not kind.steps:
                found.append(("sequence.steps", "a sequence needs at least one step"))
        case EnsembleKind():
            _ensemble(kind, found)
        case SwitchKind():
            _switch(kind, found)
        case SplitterKind():
            _splitter(kind, found)
        case None:
            pass  # the reader reported why it could not build one
        case _:
            assert_never(kind)
    if kind is not None and not isinstance(kind, DeploymentKind):
        _edges(kind, found)
    return found


def refs(kind: NodeKind) -> list[tuple[str, str]]:
    """(field, node id) of each edge, in declaration order (the order of a router's `calls`)."""
    match kind:
        case DeploymentKind():
            out = [(f"deployment.args[{i}].node", a.node) for i, a in enumerate(kind.args) if isinstance(a, BoundNode)]
            return out + [
                (f"deployment.kwargs[{k!r}].node", a.node) for k, a in kind.kwargs if isinstance(a, BoundNode)
            ]
        case SequenceKind():
            return [(f"sequence.steps[{i}]", s) for i, s in enumerate(kind.steps)]
        case EnsembleKind():
            out = [(f"ensemble.members[{i}]", m) for i, m in enumerate(kind.members)]
            return out + ([("ensemble.combiner", kind.combiner)] if kind.combiner is not None else [])
        case SwitchKind():
            out = [(f"switch.cases[{i}].node", n) for i, (_, n) in enumerate(kind.cases)]
            return [*out, ("switch.default", kind.default)]
        case SplitterKind():
            return [(f"splitter.routes[{i}].node", n) for i, (n, _) in enumerate(kind.routes)]
        case _:
            assert_never(kind)


MAX_DEPTH = 64
"""Nodes in the longest chain of nodes bound into nodes, the ingress included. Serve builds
an application by recursing through what is bound into what and fails past a few hundred
levels (measured on Ray 2.60: 500 built, 1,000 raised RecursionError); every level is also a
hop on each request. Far deeper than any real graph, and refused with a clear message rather
than a Serve traceback."""


def depth_problem(edges: Mapping[str, Sequence[str]], order: Sequence[str], ingress: str) -> str | None:
    """Why the graph is too deep, naming its longest chain; None when it is not.

    `edges` are each node's children (`Node.edges`): ids only, not `refs`, whose field
    paths only a problem needs. `order` lists dependencies first, so one pass finds every
    node's longest chain."""
    below: dict[str, str | None] = {}
    depth: dict[str, int] = {}
    for node_id in order:
        deepest, most = None, 0
        for ref in edges[node_id]:
            d = depth.get(ref, 0)
            if d > most:  # the first of equally deep children, as in declaration order
                deepest, most = ref, d
        below[node_id] = deepest
        depth[node_id] = 1 + most
    if depth.get(ingress, 0) <= MAX_DEPTH:
        return None
    chain: list[str] = []
    at: str | None = ingress
    while at is not None:
        chain.append(at)
        at = below[at]
    shown = " → ".join(f'"{n}"' for n in chain[:3]) + " → … → " + " → ".join(f'"{n}"' for n in chain[-2:])
    return (
        f"the graph is {len(chain)} nodes deep ({shown}), over the limit of {MAX_DEPTH}: "
        "Ray Serve binds it level by level and each level is a hop on every request"
    )


def _deployment(kind: DeploymentKind, found: list[Finding]) -> None:
    path = kind.import_path
    if len(path) > MAX_IMPORT_PATH:
        found.append(("deployment.import_path", f"{len(path)} characters, over the limit of {MAX_IMPORT_PATH}"))
    elif not IMPORT_PATH.fullmatch(path):
        found.append(("deployment.import_path", f"{path!r} is not of the form 'module.path:attribute'"))
    for i, arg in enumerate(kind.args):
        if isinstance(arg, BoundNode) and not arg.node:
            found.append((f"deployment.args[{i}].node", EMPTY_REF))
    for name, arg in kind.kwargs:
        if not name.isidentifier():
            found.append((f"deployment.kwargs[{name!r}]", "not a Python identifier"))
        if isinstance(arg, BoundNode) and not arg.node:
            found.append((f"deployment.kwargs[{name!r}].node", EMPTY_REF))


def _ensemble(kind: EnsembleKind, found: list[Finding]) -> None:
    members = kind.members
    if not members:
        found.append(("ensemble.members", "an ensemble needs at least one member"))
    if len(set(members)) != len(members):
        found.append(("ensemble.members", "a member is listed twice (results are keyed by member id)"))
    if kind.combiner is not None and kind.combiner in members:
        found.append(("ensemble.combiner", f'"{kind.combiner}" is also a member'))


def _switch(kind: SwitchKind, found: list[Finding]) -> None:
    if not (kind.field or kind.header) or (kind.field is not None and kind.header is not None):
        found.append(("switch", "set one of `field` (a JSON body key) or `header` to route on"))
    seen: set[str] = set()
    for i, (equals, _) in enumerate(kind.cases):
        if equals in seen:
            found.append((f"switch.cases[{i}].equals", f"{equals!r} appears in an earlier case"))
        seen.add(equals)


def _splitter(kind: SplitterKind, found: list[Finding]) -> None:
    routes = kind.routes
    if not routes:
        found.append(("splitter.routes", "a splitter needs at least one route"))
    for i, (_, weight) in enumerate(routes):
        if weight <= 0:
            found.append((f"splitter.routes[{i}].weight", f"must be positive, got {weight}"))
    total = sum(weight for _, weight in routes)
    if routes and total != SPLIT_TOTAL:
        found.append(("splitter.routes", f"weights sum to {total}, not {SPLIT_TOTAL}"))
    if len({node for node, _ in routes}) != len(routes):
        found.append(("splitter.routes", "a node is listed twice"))


def _edges(kind: RouterKind, found: list[Finding]) -> None:
    """A router's edges: each names a node, and is called with options it can honour.
    Field names are formatted only for a problem: a graph has many edges, few of them wrong."""
    match kind:
        case SequenceKind():
            targets = list(kind.steps)
        case EnsembleKind():
            targets = [*kind.members, *([kind.combiner] if kind.combiner is not None else [])]
        case SwitchKind():
            targets = [n for _, n in kind.cases] + [kind.default]
        case SplitterKind():
            targets = [n for n, _ in kind.routes]
        case _:
            assert_never(kind)
    members = len(kind.members) if isinstance(kind, EnsembleKind) else 0

    def field(i: int) -> str:
        return refs(kind)[i][0]

    for i, target in enumerate(targets):
        if not target:
            default = isinstance(kind, SwitchKind) and i == len(kind.cases)
            found.append(
                (field(i), "missing; name the node taking requests that match no case" if default else EMPTY_REF)
            )
    for i, call in enumerate(kind.calls):
        if call == DEFAULT_CALL:
            continue
        timeout = call.timeout_s
        if timeout is not None and not 0 < timeout < math.inf:  # NaN too
            found.append(
                (f"{field(i)}.timeout_s", f"must be a finite number of seconds ≥ 0 (0: no timeout), got {timeout}")
            )
        if not 0 <= call.retries <= MAX_RETRIES:
            found.append((f"{field(i)}.retries", f"must be an integer from 0 to {MAX_RETRIES}, got {call.retries}"))
        if call.optional and i >= members:
            why = "only an ensemble's members may be optional (the others' output is the result)"
            found.append((f"{field(i)}.optional", why))
