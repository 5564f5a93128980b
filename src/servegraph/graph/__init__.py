"""Parse bytes into a validated, immutable Ray DAG (pure: no I/O but `load_graph`)."""

from __future__ import annotations

from pathlib import Path

from servegraph.dag.model import Graph
from servegraph.graph.decode import DEFAULT_MAX_BYTES, Format, decode, encode
from servegraph.graph.errors import GraphError, Problem
from servegraph.graph.validate import MAX_NODES, to_model

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_NODES",
    "Format",
    "GraphError",
    "Problem",
    "decode",
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
    """Read a graph file whose format is given by its extension (.pb, .textproto, .json)."""
    path = Path(path)
    with path.open("rb") as f:
        data = f.read(max_bytes + 1)
    return parse_graph(data, Format.from_path(path), max_bytes=max_bytes)
