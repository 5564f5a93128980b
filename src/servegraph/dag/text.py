"""How a node's kind and an edge's call options read to a person (pure, standard library only).

`servegraph inspect` (render.inspect) and `servegraph status` (statustree.tree) both
print them: written once here, a graph reads the same in both.
"""

from __future__ import annotations

from servegraph.dag.model import Call, DeploymentKind, EnsembleKind, NodeKind, SequenceKind, SplitterKind, SwitchKind


def kind_text(kind: NodeKind) -> str:
    """`pkg.mod:Cls`, `sequence`, `ensemble`, `switch on header x-kind`, `splitter 90/10`."""
    match kind:
        case DeploymentKind():
            return kind.import_path
        case SequenceKind():
            return "sequence"
        case EnsembleKind():
            return "ensemble"
        case SwitchKind():
            return f"switch on {'field ' + kind.field if kind.field else 'header ' + str(kind.header)}"
        case SplitterKind():
            return "splitter " + "/".join(str(weight) for _, weight in kind.routes)


def kind_label(kind: NodeKind, streams: bool) -> str:
    """`kind_text`, marked `(streams)` when the node's output is a stream (`dag.streams`)."""
    return kind_text(kind) + (" (streams)" if streams else "")


def call_text(call: Call) -> str:
    """`timeout 0.5s, retries 1, optional`; empty for a plain call."""
    parts = [f"timeout {call.timeout_s:g}s"] if call.timeout_s is not None else []
    parts += [f"retries {call.retries}"] if call.retries else []
    parts += ["optional"] if call.optional else []
    return ", ".join(parts)
