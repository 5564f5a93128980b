"""How a node's kind and an edge's call options read to a person (pure, standard library only).

`servegraph inspect` (render.inspect) and `servegraph status` (statustree.tree) both
print them: written once here, a graph reads the same in both.
"""

from __future__ import annotations

from typing import assert_never

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
        case _:
            assert_never(kind)


def kind_label(kind: NodeKind, streams: bool) -> str:
    """`kind_text`, marked `(streams)` when the node's output is a stream (`dag.streams`)."""
    return kind_text(kind) + (" (streams)" if streams else "")


def call_text(call: Call) -> str:
    """`timeout 0.5s, retries 1, optional`; empty for a plain call."""
    parts = [f"timeout {call.timeout_s:g}s"] if call.timeout_s is not None else []
    parts += [f"retries {call.retries}"] if call.retries else []
    parts += ["optional"] if call.optional else []
    return ", ".join(parts)


_BINARY_UNITS = (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))


def memory_text(n_bytes: float) -> str:
    """Bytes as people read a pod's memory: `512Mi`, `1536Mi`, `32Gi`; `~1.863Gi` when
    neither the largest unit nor the one below divides it (2e9); plain bytes under 1Ki."""
    n = int(n_bytes)
    if n != n_bytes or n < 1024:
        return f"{n_bytes:g}"
    i = next(i for i, (_, unit) in enumerate(_BINARY_UNITS) if n >= unit)
    for suffix, unit in _BINARY_UNITS[i : i + 2]:
        if n % unit == 0:
            return f"{n // unit}{suffix}"
    suffix, unit = _BINARY_UNITS[i]
    return f"~{n / unit:.4g}{suffix}"
