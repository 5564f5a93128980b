"""Parse bytes into a validated, immutable Ray DAG (pure: no I/O but `load_graph`)."""

from __future__ import annotations

from pathlib import Path

from servegraph.dag.model import Graph
from servegraph.graph.decode import DEFAULT_MAX_BYTES, Format, decode, decode_file, encode
from servegraph.graph.errors import GraphError, Problem
from servegraph.graph.limits import MAX_NODES
from servegraph.graph.validate import to_model

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_NODES",
    "Format",
    "GraphError",
    "Problem",
    "decode",
    "decode_file",
    "encode",
    "load_graph",
    "parse_graph",
]


def parse_graph(
    data: bytes,
    fmt: Format = Format.BINARY,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_nodes: int = MAX_NODES,
) -> Graph:
    """Decode and validate; raise GraphError naming every problem."""
    return to_model(decode(data, fmt, max_bytes=max_bytes), max_nodes=max_nodes)


def load_graph(path: str | Path, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Graph:
    """Read a graph file in the format its extension names (.pb, .txtpb, .json), else the
    one its content shows."""
    path = Path(path)
    with path.open("rb") as f:
        data = f.read(max_bytes + 1)
    return to_model(decode_file(data, path, max_bytes=max_bytes))
