"""Protobuf `Graph` to the immutable model, collecting every problem before failing.

Reporting all problems at once matters to registry authors: one publish/fix
cycle per mistake is slow. And this is every check the operator runs before it
renders, worker-group planning included, so `servegraph validate` and `pack`
accept exactly the graphs the operator would apply.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from servegraph.dag import model, streams
from servegraph.dag.rules import NODE_ID, depth_problem
from servegraph.gcpause import gc_paused
from servegraph.graph import hints as placement
from servegraph.graph.errors import GraphError, Problem, where
from servegraph.graph.limits import MAX_NODES
from servegraph.graph.nodes import MAX_STRING, Budget, finite_non_negative, to_node
from servegraph.graph.servicers import servicer_functions
from servegraph.graph.workers import plan_worker_groups
from servegraph.v1 import graph_pb2

SUPPORTED_SCHEMA_VERSIONS = frozenset({1})
MAX_ENTRIES = 64
"""Labels of the graph (copied onto the RayService), node selector entries and worker groups."""
MAX_LIST = 1_000
"""Requirements, modules and environment variables of an application's runtime_env."""

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_APP_NAME = NODE_ID
_ROUTE_PREFIX = re.compile(r"^/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*$")
_ENV_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_REMOTE_URI = re.compile(r"^(https|s3|gs|azure|abfss)://\S+$")
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an RFC 9110 token
TRACE_HEADERS = ("traceparent", "tracestate")

Add = Callable[[Problem], None]


@gc_paused
def to_model(msg: graph_pb2.Graph, *, max_nodes: int = MAX_NODES) -> model.Graph:
    """Validate a decoded graph; raise GraphError listing every problem found."""
    problems: list[Problem] = []
    add = problems.append

    if msg.schema_version not in SUPPORTED_SCHEMA_VERSIONS:
        supported = ", ".join(str(v) for v in sorted(SUPPORTED_SCHEMA_VERSIONS))
        add(
            Problem(
                where(field="schema_version"),
                f"unsupported schema_version {msg.schema_version}; this servegraph reads {supported}",
            )
        )
        # A graph of another schema version cannot be interpreted field by field.
        raise GraphError(problems)
    if not _DNS1123_LABEL.fullmatch(msg.name):
        add(
            Problem(
                where(field="name"),
                f"{msg.name!r} is not a DNS-1123 label (lowercase letters, digits, '-', at most 63)",
            )
        )
    total = sum(len(a.nodes) for a in msg.applications)
    if total > max_nodes:
        add(Problem("", f"graph has {total} nodes, over the limit of {max_nodes}"))
        raise GraphError(problems)
    if not msg.applications:
        add(Problem(where(field="applications"), "a graph needs at least one application"))

    labels = _labels(msg.labels, add)
    cluster = _cluster(msg.cluster, add)
    apps = []
    names: set[str] = set()
    prefixes: dict[str, str] = {}
    budget = Budget()
    for app_msg in msg.applications:
        app = _application(app_msg, problems, budget)
        if app_msg.name in names:
            add(Problem(where(app=app_msg.name, field="name"), "duplicate application name"))
        names.add(app_msg.name)
        if app_msg.route_prefix in prefixes:
            other = prefixes[app_msg.route_prefix]
            add(
                Problem(
                    where(app=app_msg.name, field="route_prefix"),
                    f'{app_msg.route_prefix!r} is already used by application "{other}"',
                )
            )
        prefixes.setdefault(app_msg.route_prefix, app_msg.name)
        if app is not None:
            apps.append(app)

    if problems:
        raise GraphError(problems)
    graph = model.Graph(
        name=msg.name,
        version=msg.version,
        schema_version=msg.schema_version,
        applications=tuple(apps),
        cluster=cluster,
        labels=labels,
    )
    # The RayService's worker groups come from these plans: a graph that cannot be
    # planned could not be applied, so it is as invalid as one with a cycle.
    plan_worker_groups(graph)
    return graph


def _labels(labels: Mapping[str, str], add: Add) -> tuple[tuple[str, str], ...]:
    if len(labels) > MAX_ENTRIES:  # before any per-label work: 200,000 labels took seconds
        add(Problem(where(field="labels"), f"{len(labels)} labels, over the limit of {MAX_ENTRIES}"))
        return ()
    for key, value in sorted(labels.items()):
        name = key.rsplit("/", 1)[-1]
        prefix = key[: -len(name) - 1] if "/" in key else ""
        if not _LABEL_NAME.fullmatch(name) or (
            prefix and not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", prefix)
        ):
            add(Problem(where(field=f"labels[{key!r}]"), "not a valid Kubernetes label key"))
        if not _LABEL_VALUE.fullmatch(value):
            add(
                Problem(
                    where(field=f"labels[{key!r}]"),
                    f"{value!r} is not a valid Kubernetes label value",
                )
            )
    return tuple(sorted(labels.items()))


def _cluster(msg: graph_pb2.ClusterHints, add: Add) -> model.ClusterHints:
    hints = []
    seen: set[str] = set()
    if len(msg.worker_groups) > MAX_ENTRIES:
        add(Problem(where(field="cluster.worker_groups"), f"over the limit of {MAX_ENTRIES} worker groups"))
        return model.ClusterHints()
    for field_name, text in (("cluster.image", msg.image), ("cluster.ray_version", msg.ray_version)):
        if len(text) > 512:
            add(Problem(where(field=field_name), f"{len(text)} characters, over the limit of 512"))
    for i, h in enumerate(msg.worker_groups):
        loc = where(field=f"cluster.worker_groups[{i}]")
        if len(h.node_selector) > MAX_ENTRIES:
            add(Problem(loc, f"node_selector has over {MAX_ENTRIES} entries"))
            continue
        placement.node_selector(h.node_selector, loc, add)
        if h.name:
            if not _DNS1035_LABEL.fullmatch(h.name) or len(h.name) > 20:
                add(Problem(loc, f"name {h.name!r} must be a DNS-1035 label of at most 20 characters"))
            if h.name in seen:
                add(Problem(loc, f"duplicate worker group name {h.name!r}"))
            seen.add(h.name)
        if not finite_non_negative(h.cpus_per_worker):
            add(Problem(loc, "cpus_per_worker must be a finite number ≥ 0"))
        if h.accelerator_type and not h.gpu:
            add(Problem(loc, "accelerator_type is set but gpu is false"))
        hints.append(
            model.WorkerGroupHint(
                name=h.name or None,
                gpu=h.gpu or bool(h.accelerator_type),
                accelerator_type=h.accelerator_type or None,
                cpus_per_worker=h.cpus_per_worker or None,
                gpus_per_worker=h.gpus_per_worker or None,
                memory_bytes_per_worker=h.memory_bytes_per_worker or None,
                max_workers=h.max_workers or None,
                node_selector=tuple(sorted(h.node_selector.items())),
                placement=placement.to_placement(h, loc, add),
            )
        )
    return model.ClusterHints(
        ray_version=msg.ray_version or None,
        image=msg.image or None,
        worker_groups=tuple(hints),
    )


def _application(msg: graph_pb2.Application, problems: list[Problem], budget: Budget) -> model.Application | None:
    app = msg.name
    add = problems.append
    before = len(problems)
    if not _APP_NAME.fullmatch(app):
        add(
            Problem(
                where(app=app, field="name"),
                "must be 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
            )
        )
    prefix = msg.route_prefix
    if not prefix.startswith("/") or not _ROUTE_PREFIX.fullmatch(prefix):
        add(
            Problem(
                where(app=app, field="route_prefix"),
                f"{prefix!r} must start with '/' and contain only URL path characters",
            )
        )
    elif len(prefix) > 1 and prefix.endswith("/"):
        add(Problem(where(app=app, field="route_prefix"), f"{prefix!r} must not end with '/'"))
    if not msg.nodes:
        add(Problem(where(app=app, field="nodes"), "an application needs at least one node"))
    if not msg.ingress:
        add(Problem(where(app=app, field="ingress"), "missing; name the node that receives requests"))
    elif msg.nodes and msg.ingress not in msg.nodes:
        add(Problem(where(app=app, field="ingress"), f'unknown node "{msg.ingress}"'))

    runtime_env = _runtime_env(app, msg.runtime_env, add)
    telemetry = _telemetry(app, msg.telemetry, add)
    servicers = servicer_functions(app, msg.grpc_servicer_functions, add)
    nodes: dict[str, model.Node] = {}
    edges: dict[str, tuple[str, ...]] = {}
    node_msgs = msg.nodes
    for node_id in sorted(node_msgs):
        node_msg = node_msgs[node_id]
        node = to_node(app, node_id, node_msg, problems, budget)
        if node is not None:
            nodes[node_id] = node
            edges[node_id] = node.edges
        else:
            edges[node_id] = _raw_edges(node_msg)
    order = _order(app, msg.ingress, edges, add)
    if len(problems) > before or order is None:
        return None
    kinds = {node_id: node.kind for node_id, node in nodes.items()}
    if (too_deep := depth_problem(edges, order, msg.ingress)) is not None:
        add(Problem(where(app=app, node=msg.ingress), too_deep))
        return None
    for node_id, field, message in streams.problems(kinds, order, msg.ingress):
        add(Problem(where(app=app, node=node_id, field=field), message))
    if len(problems) > before:
        return None
    return model.Application(
        name=app,
        route_prefix=prefix,
        ingress=msg.ingress,
        nodes=nodes,
        order=order,
        runtime_env=runtime_env,
        telemetry=telemetry,
        grpc_servicer_functions=servicers,
    )


def _raw_edges(msg: graph_pb2.Node) -> tuple[str, ...]:
    """Every node id a node refers to, read from the message so that a node with
    other problems still takes part in the reference, cycle and reachability checks."""
    which = msg.WhichOneof("kind")
    if which is None:
        return ()
    refs: list[str] = []

    def walk(m: Any) -> None:
        for fd, value in m.ListFields():
            if fd.message_type is None:
                continue
            if fd.message_type.full_name == "servegraph.v1.NodeRef":
                refs.extend(v.id for v in (value if fd.is_repeated else [value]) if v.id)
            elif fd.message_type.full_name.startswith("servegraph.v1."):
                items = value.values() if fd.message_type.GetOptions().map_entry else value
                for v in items if fd.is_repeated else [value]:
                    walk(v)

    walk(getattr(msg, which))
    return tuple(dict.fromkeys(refs))


def _order(app: str, ingress: str, edges: dict[str, tuple[str, ...]], add: Any) -> tuple[str, ...] | None:
    """Topological order (dependencies first, each layer sorted by id) after checking
    refs, cycles and reachability."""
    ok = True
    dependents: dict[str, list[str]] = {node_id: [] for node_id in edges}
    for node_id, children in edges.items():
        for child in children:
            if child == node_id:
                add(Problem(where(app=app, node=node_id), "refers to itself"))
                ok = False
            elif child not in edges:
                add(Problem(where(app=app, node=node_id), f'unknown node reference "{child}"'))
                ok = False
            else:
                dependents[child].append(node_id)
    if not ok:
        return None
    waiting = {node_id: len(children) for node_id, children in edges.items()}
    layer = sorted(node_id for node_id, n in waiting.items() if n == 0)
    order: list[str] = []
    while layer:
        order.extend(layer)
        ready = []
        for done in layer:
            for parent in dependents[done]:
                waiting[parent] -= 1
                if not waiting[parent]:
                    ready.append(parent)
        layer = sorted(ready)
    if len(order) < len(edges):
        add(Problem(where(app=app), "cycle between nodes " + " → ".join(f'"{n}"' for n in _cycle(edges, waiting))))
        return None
    if ingress in edges:
        reachable = {ingress}
        queue = deque([ingress])
        while queue:
            for child in edges[queue.popleft()]:
                if child not in reachable:
                    reachable.add(child)
                    queue.append(child)
        for node_id in order:
            if node_id not in reachable:
                add(Problem(where(app=app, node=node_id), f'unreachable from the ingress "{ingress}"'))
                ok = False
    return tuple(order) if ok else None


def _cycle(edges: dict[str, tuple[str, ...]], waiting: dict[str, int]) -> list[str]:
    """One cycle among the nodes Kahn's algorithm could not order, closed on its first node.

    Each such node still waits on a child that is itself unordered, so walking from
    one to such a child must come back to a node already seen."""
    stuck = {node_id for node_id, n in waiting.items() if n}
    path = [min(stuck)]
    seen = {path[0]: 0}
    while True:
        nxt = next(c for c in edges[path[-1]] if c in stuck)
        if nxt in seen:
            return [*path[seen[nxt] :], nxt]
        seen[nxt] = len(path)
        path.append(nxt)


def _runtime_env(app: str, msg: graph_pb2.RuntimeEnv, add: Add) -> model.RuntimeEnv:
    for name, count in (("pip", len(msg.pip)), ("py_modules", len(msg.py_modules)), ("env_vars", len(msg.env_vars))):
        if count > MAX_LIST:
            add(Problem(where(app=app, field=f"runtime_env.{name}"), f"{count} entries, over the limit of {MAX_LIST}"))
            return model.RuntimeEnv()
    texts = [*msg.pip, *msg.py_modules, msg.working_dir, *msg.env_vars.values()]
    if any(len(t) > MAX_STRING for t in texts):
        add(Problem(where(app=app, field="runtime_env"), f"a string over the limit of {MAX_STRING} characters"))
        return model.RuntimeEnv()
    for i, spec in enumerate(msg.pip):
        if not spec.strip():
            add(Problem(where(app=app, field=f"runtime_env.pip[{i}]"), "empty requirement"))
    for name in msg.env_vars:
        if not _ENV_VAR.fullmatch(name):
            add(
                Problem(
                    where(app=app, field=f"runtime_env.env_vars[{name!r}]"),
                    "not a valid environment variable name",
                )
            )
    uris = [("working_dir", msg.working_dir)] if msg.working_dir else []
    uris += [(f"py_modules[{i}]", u) for i, u in enumerate(msg.py_modules)]
    for field, uri in uris:
        if not _REMOTE_URI.fullmatch(uri):
            add(
                Problem(
                    where(app=app, field=f"runtime_env.{field}"),
                    f"{uri!r} must be a remote URI (https://, s3://, gs://); local paths do not exist in the cluster",
                )
            )
    return model.RuntimeEnv(
        pip=tuple(msg.pip),
        env_vars=tuple(sorted(msg.env_vars.items())),
        working_dir=msg.working_dir or None,
        py_modules=tuple(msg.py_modules),
    )


def _telemetry(app: str, msg: graph_pb2.Telemetry, add: Add) -> model.Telemetry:
    """Header names are compared lower-cased, as routers see them."""
    names: list[str] = []
    for i, name in enumerate(msg.forward_headers):
        field = where(app=app, field=f"telemetry.forward_headers[{i}]")
        lower = name.lower()
        if not _HEADER_NAME.fullmatch(name):
            add(Problem(field, f"{name!r} is not an HTTP header name"))
        elif lower in TRACE_HEADERS:
            add(Problem(field, f"{name!r} is always forwarded (W3C trace context); remove it"))
        elif lower in names:
            add(Problem(field, f"{name!r} is listed twice"))
        else:
            names.append(lower)
    return model.Telemetry(forward_headers=tuple(names), metrics=not msg.disable_metrics)
