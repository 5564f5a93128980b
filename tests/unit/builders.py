"""Small builders for graph messages, so each test states only what it is about."""

from __future__ import annotations

from typing import Any

from google.protobuf import struct_pb2

from servegraph.v1 import graph_pb2


def value(v: Any) -> graph_pb2.Argument:
    arg = graph_pb2.Argument()
    arg.value.CopyFrom(struct_pb2.Value())
    if isinstance(v, bool):
        arg.value.bool_value = v
    elif isinstance(v, int | float):
        arg.value.number_value = v
    elif isinstance(v, str):
        arg.value.string_value = v
    elif v is None:
        arg.value.null_value = struct_pb2.NULL_VALUE
    else:
        arg.value.struct_value.update(v) if isinstance(v, dict) else arg.value.list_value.extend(v)
    return arg


def ref(node_id: str) -> graph_pb2.Argument:
    return graph_pb2.Argument(node=graph_pb2.NodeRef(id=node_id))


def deployment(
    import_path: str = "servegraph.examples:Tokenizer",
    *args: graph_pb2.Argument,
    cpus: float = 0.5,
    **kwargs: graph_pb2.Argument,
) -> graph_pb2.Node:
    node = graph_pb2.Node(deployment=graph_pb2.Deployment(import_path=import_path, args=list(args)))
    for k, v in kwargs.items():
        node.deployment.kwargs[k].CopyFrom(v)
    node.resources.num_cpus = cpus
    return node


def chain_app(name: str = "app", prefix: str | None = None, length: int = 2) -> graph_pb2.Application:
    """`n0` (ingress) binds `n1`, which binds `n2`, ...; the last node binds nothing."""
    app = graph_pb2.Application(name=name, route_prefix=prefix or f"/{name}", ingress="n0")
    for i in range(length):
        node = deployment(f"pkg.mod:Node{i}", ref(f"n{i + 1}")) if i + 1 < length else deployment("pkg.mod:Leaf")
        app.nodes[f"n{i}"].CopyFrom(node)
    return app


def graph(*apps: graph_pb2.Application, name: str = "g") -> graph_pb2.Graph:
    return graph_pb2.Graph(name=name, version="1", schema_version=1, applications=list(apps) or [chain_app()])
