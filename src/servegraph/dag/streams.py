"""Where a stream may flow in an application's DAG (pure, standard library only).

A node's output is a *stream* (items, one at a time) or a single answer:

* a deployment streams when it says so (`streaming: true`, a generator);
* a sequence streams from its first streaming step on: the steps before it are
  unary and feed it their output, the steps after it are *transforms* called once
  per item (a unary one maps the item, a streaming one replaces it by the items it
  yields, none to drop it);
* a switch or splitter passes its children's output through unchanged, so their
  children must agree: all stream or none, else a client's wire format (a chunked
  stream or one JSON body) would depend on the branch a request took;
* an ensemble waits for every member's whole answer, so its members must not
  stream; it streams when its combiner does;
* the ingress must not be a streaming deployment: only a router turns items into a
  chunked HTTP body or gRPC messages (put the generator in a one-step sequence).

The validator reports `problems` for a published graph; the runtime's builder asks
`streaming_outputs` to call each child the right way. One rule set for both, like
`dag.rules`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import assert_never

from servegraph.dag.model import DeploymentKind, EnsembleKind, NodeKind, SequenceKind, SplitterKind, SwitchKind

Finding = tuple[str, str | None, str]
"""(node id, field or None, what is wrong)."""


def streaming_outputs(kinds: Mapping[str, NodeKind], order: Iterable[str]) -> frozenset[str]:
    """Ids of the nodes whose output is a stream; `order` lists dependencies first.

    A switch or splitter with disagreeing children counts as streaming when any
    child streams; `problems` reports it.
    """
    out: set[str] = set()
    for node_id in order:
        kind = kinds[node_id]
        match kind:
            case DeploymentKind():
                streams = kind.streaming
            case SequenceKind():
                streams = any(s in out for s in kind.steps)
            case EnsembleKind():
                streams = kind.combiner is not None and kind.combiner in out
            case SwitchKind():
                streams = any(n in out for _, n in kind.cases) or kind.default in out
            case SplitterKind():
                streams = any(n in out for n, _ in kind.routes)
            case _:
                assert_never(kind)
        if streams:
            out.add(node_id)
    return frozenset(out)


def problems(kinds: Mapping[str, NodeKind], order: Iterable[str], ingress: str) -> list[Finding]:
    """Every place a stream flows where it cannot: the rules in this module's docstring."""
    order = tuple(order)
    streaming = streaming_outputs(kinds, order)
    found: list[Finding] = []
    for node_id in order:
        kind = kinds[node_id]
        match kind:
            case EnsembleKind():
                for i, member in enumerate(kind.members):
                    if member in streaming:
                        found.append(
                            (
                                node_id,
                                f"ensemble.members[{i}]",
                                f'member "{member}" streams; an ensemble needs each member\'s whole answer '
                                "(a combiner may stream)",
                            )
                        )
            case SwitchKind():
                children = [("switch.cases", n) for _, n in kind.cases] + [("switch.default", kind.default)]
                found.extend(_disagreeing(node_id, "switch", [n for _, n in children], streaming))
            case SplitterKind():
                found.extend(_disagreeing(node_id, "splitter", [n for n, _ in kind.routes], streaming))
            case DeploymentKind() | SequenceKind():
                pass  # a deployment's output and a sequence's are its own to stream or not
            case _:
                assert_never(kind)
    ingress_kind = kinds.get(ingress)
    if isinstance(ingress_kind, DeploymentKind) and ingress_kind.streaming:
        found.append(
            (
                ingress,
                "deployment.streaming",
                "a streaming deployment cannot be the ingress; make the ingress a sequence with it as the one step, "
                "which serves its items over HTTP and gRPC",
            )
        )
    return found


def _disagreeing(node_id: str, what: str, children: list[str], streaming: frozenset[str]) -> list[Finding]:
    streams = sorted({c for c in children if c in streaming})
    unary = sorted({c for c in children if c not in streaming})
    if not streams or not unary:
        return []
    return [
        (
            node_id,
            None,
            f"a {what}'s children must all stream or none: {_names(streams)} stream, {_names(unary)} do not",
        )
    ]


def _names(ids: list[str]) -> str:
    return ", ".join(f'"{i}"' for i in ids)
