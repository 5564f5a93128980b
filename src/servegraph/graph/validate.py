"""Protobuf `Graph` to the immutable model, collecting every problem before failing.

Reporting all problems at once matters to registry authors: one publish/fix
cycle per mistake is slow when the operator is the only place that runs the
check.
"""

from __future__ import annotations

import functools
import math
import re
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from google.protobuf import struct_pb2

from servegraph.collector import collector_paused
from servegraph.graph import model
from servegraph.graph.errors import GraphError, Problem, where
from servegraph.v1 import graph_pb2

SUPPORTED_SCHEMA_VERSIONS = frozenset({1})
MAX_NODES = 10_000
IMPORT_RUNTIME = "servegraph.runtime:build"

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_NODE_ID = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
_APP_NAME = _NODE_ID
# `module.path:attr` or `module.attr`: the language of `ident(\.ident)*[:.]ident[\w.]*`,
# which on a failing match tries every split of the dots (32 KB took 7 s; 16 MB, hours).
_IMPORT_PATH = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_.]*|(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_.]*)$"
)
_ROUTE_PREFIX = re.compile(r"^/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*$")
_ENV_VAR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_REMOTE_URI = re.compile(r"^(https|s3|gs|azure|abfss)://\S+$")
_RESERVED_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory"})
_MAX_SAFE_INT = 2**53

Add = Callable[[Problem], None]
Bad = Callable[[str | None, str], None]


@collector_paused
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
    for app_msg in msg.applications:
        app = _application(app_msg, problems)
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
    return model.Graph(
        name=msg.name,
        version=msg.version,
        schema_version=msg.schema_version,
        applications=tuple(apps),
        cluster=cluster,
        labels=labels,
    )


def _labels(labels: Mapping[str, str], add: Add) -> tuple[tuple[str, str], ...]:
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
    for i, h in enumerate(msg.worker_groups):
        loc = where(field=f"cluster.worker_groups[{i}]")
        if h.name:
            if not _DNS1035_LABEL.fullmatch(h.name) or len(h.name) > 20:
                add(Problem(loc, f"name {h.name!r} must be a DNS-1035 label of at most 20 characters"))
            if h.name in seen:
                add(Problem(loc, f"duplicate worker group name {h.name!r}"))
            seen.add(h.name)
        if not _finite_non_negative(h.cpus_per_worker):
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
            )
        )
    return model.ClusterHints(
        ray_version=msg.ray_version or None,
        image=msg.image or None,
        worker_groups=tuple(hints),
    )


def _application(msg: graph_pb2.Application, problems: list[Problem]) -> model.Application | None:
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
    nodes: dict[str, model.Node] = {}
    edges: dict[str, tuple[str, ...]] = {}
    node_msgs = msg.nodes
    for node_id in sorted(node_msgs):
        node_msg = node_msgs[node_id]
        node = _node(app, node_id, node_msg, problems)
        if node is not None:
            nodes[node_id] = node
            edges[node_id] = node.edges
        else:
            edges[node_id] = _raw_edges(node_msg)
    order = _order(app, msg.ingress, edges, add)
    if len(problems) > before or order is None:
        return None
    return model.Application(
        name=app,
        route_prefix=prefix,
        ingress=msg.ingress,
        nodes=nodes,
        order=order,
        runtime_env=runtime_env,
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


def _node(app: str, node_id: str, msg: graph_pb2.Node, problems: list[Problem]) -> model.Node | None:
    add = problems.append
    before = len(problems)

    def bad(field: str | None, message: str) -> None:
        add(Problem(where(app=app, node=node_id, field=field), message))

    if not _NODE_ID.fullmatch(node_id):
        bad(
            None,
            "id is not a deployment name Ray accepts here: 1-63 letters, digits, '-', '_' or '.' (no '#'), starting and ending with a letter or digit",
        )
    kind = _kind(msg, bad)
    resources = _resources(msg.resources, bad)
    num_replicas, autoscaling = _scaling(msg.scaling, bad)
    # Read each timing once: every field access on a protobuf message builds a new object.
    timings = (
        msg.health_check_period_s,
        msg.health_check_timeout_s,
        msg.graceful_shutdown_wait_loop_s,
        msg.graceful_shutdown_timeout_s,
    )
    for name, value in zip(_TIMINGS, timings, strict=True):
        if not _finite_non_negative(value):
            bad(name, "must be a finite number ≥ 0")
    if msg.max_queued_requests < -1:
        bad("max_queued_requests", "must be -1 (no limit), 0 (default) or positive")
    user_config = None
    if msg.HasField("user_config"):
        try:
            user_config = _struct(msg.user_config)
        except _NotFinite:
            bad("user_config", _NOT_FINITE)
    if len(problems) > before or kind is None:
        return None
    period, timeout, wait_loop, shutdown = timings
    return model.Node(
        id=node_id,
        kind=kind,
        resources=resources,
        num_replicas=num_replicas,
        autoscaling=autoscaling,
        max_ongoing_requests=msg.max_ongoing_requests or None,
        max_queued_requests=msg.max_queued_requests or None,
        user_config=user_config,
        health_check_period_s=period or None,
        health_check_timeout_s=timeout or None,
        graceful_shutdown_wait_loop_s=wait_loop or None,
        graceful_shutdown_timeout_s=shutdown or None,
        max_replicas_per_node=msg.max_replicas_per_node or None,
    )


_TIMINGS = (
    "health_check_period_s",
    "health_check_timeout_s",
    "graceful_shutdown_wait_loop_s",
    "graceful_shutdown_timeout_s",
)


def _kind(msg: graph_pb2.Node, bad: Bad) -> model.NodeKind | None:
    which = msg.WhichOneof("kind")
    if which is None:
        bad(None, "no kind set; set one of deployment, sequence, ensemble, switch, splitter")
        return None
    if which == "deployment":
        d = msg.deployment
        if not _IMPORT_PATH.fullmatch(d.import_path):
            bad(
                "deployment.import_path",
                f"{d.import_path!r} is not of the form 'module.path:attribute'",
            )
        args = tuple([_argument(a, "deployment.args", i, bad) for i, a in enumerate(d.args)])
        kwargs: tuple[tuple[str, model.Argument], ...] = ()
        if d.kwargs:
            given = d.kwargs
            kwargs = tuple([(k, _argument(given[k], "deployment.kwargs", k, bad)) for k in sorted(given)])
            for k, _ in kwargs:
                if not k.isidentifier():
                    bad(f"deployment.kwargs[{k!r}]", "not a Python identifier")
        return model.DeploymentKind(import_path=d.import_path, args=args, kwargs=kwargs)
    if which == "sequence":
        steps = _refs(msg.sequence.steps, "sequence.steps", bad)
        if not steps:
            bad("sequence.steps", "a sequence needs at least one step")
        return model.SequenceKind(steps=steps)
    if which == "ensemble":
        e = msg.ensemble
        members = _refs(e.members, "ensemble.members", bad)
        if not members:
            bad("ensemble.members", "an ensemble needs at least one member")
        if len(set(members)) != len(members):
            bad("ensemble.members", "a member is listed twice")
        combiner = _ref(e.combiner, "ensemble.combiner", bad) if e.HasField("combiner") else None
        if combiner is not None and combiner in members:
            bad("ensemble.combiner", f'"{combiner}" is also a member')
        return model.EnsembleKind(members=members, combiner=combiner)
    if which == "switch":
        s = msg.switch
        on = s.WhichOneof("on")
        if on is None or not getattr(s, on):
            bad("switch", "set `field` (a JSON body key) or `header` to route on")
        cases = []
        seen: set[str] = set()
        for i, c in enumerate(s.cases):
            if c.equals in seen:
                bad(f"switch.cases[{i}].equals", f"{c.equals!r} appears in an earlier case")
            seen.add(c.equals)
            cases.append((c.equals, _ref(c.node, f"switch.cases[{i}].node", bad)))
        if not s.HasField("default"):
            bad("switch.default", "missing; name the node taking requests that match no case")
        default = _ref(s.default, "switch.default", bad) if s.HasField("default") else ""
        return model.SwitchKind(
            cases=tuple(cases),
            default=default,
            field=s.field if on == "field" else None,
            header=s.header.lower() if on == "header" else None,
        )
    s_msg = msg.splitter
    routes = tuple((_ref(r.node, f"splitter.routes[{i}].node", bad), r.weight) for i, r in enumerate(s_msg.routes))
    if not routes:
        bad("splitter.routes", "a splitter needs at least one route")
    for i, (_, weight) in enumerate(routes):
        if weight == 0:
            bad(f"splitter.routes[{i}].weight", "must be positive")
    total = sum(w for _, w in routes)
    if routes and total != 100:
        bad("splitter.routes", f"weights sum to {total}, not 100")
    if len({n for n, _ in routes}) != len(routes):
        bad("splitter.routes", "a node is listed twice")
    return model.SplitterKind(routes=routes)


def _ref(ref: graph_pb2.NodeRef, field: str, bad: Bad) -> str:
    if not ref.id:
        bad(field, "empty node reference")
    return ref.id


def _refs(refs: Any, field: str, bad: Bad) -> tuple[str, ...]:
    return tuple(_ref(r, f"{field}[{i}]", bad) for i, r in enumerate(refs))


def _argument(arg: graph_pb2.Argument, prefix: str, key: int | str, bad: Bad) -> model.Argument:
    """One constructor argument; the field path is only formatted for a problem."""
    which = arg.WhichOneof("kind")
    if which == "node":
        node = arg.node.id
        if not node:
            bad(f"{prefix}[{key!r}].node", "empty node reference")
        return _shared_ref(node)
    if which is None:
        bad(f"{prefix}[{key!r}]", "neither a value nor a node reference")
        return model.Literal(None)
    try:
        return model.Literal(_value(arg.value))
    except _NotFinite:
        bad(f"{prefix}[{key!r}]", _NOT_FINITE)
        return model.Literal(None)


def _resources(msg: graph_pb2.Resources, bad: Bad) -> model.Resources:
    cpus, gpus, accelerator = msg.num_cpus, msg.num_gpus, msg.accelerator_type
    for name, amount in (("num_cpus", cpus), ("num_gpus", gpus)):
        if not _finite_non_negative(amount):
            bad(f"resources.{name}", f"must be a finite number ≥ 0, got {amount}")
    if gpus > 1 and not float(gpus).is_integer():
        bad("resources.num_gpus", f"{gpus} GPUs: Ray accepts fractions only up to 1")
    if accelerator and gpus <= 0:
        bad(
            "resources.accelerator_type",
            f"{accelerator!r} is meaningless without resources.num_gpus > 0",
        )
    custom = tuple([(k, msg.custom[k]) for k in sorted(msg.custom)]) if msg.custom else ()
    for name, value in custom:
        if name in _RESERVED_RESOURCES or not name:
            bad(
                f"resources.custom[{name!r}]",
                "use num_cpus, num_gpus or memory_bytes, not a custom resource",
            )
        elif not 0 < value < math.inf:
            bad(f"resources.custom[{name!r}]", f"must be a finite number > 0, got {value}")
    return _shared_resources(cpus if cpus else None, gpus, msg.memory_bytes, custom, accelerator or None)


# Most nodes of a graph ask for one of a few resource shapes and scaling policies:
# sharing the (immutable) objects saves building and keeping one per node.
_shared_resources = functools.lru_cache(maxsize=1024, typed=True)(model.Resources)
_shared_ref = functools.lru_cache(maxsize=1 << 14)(model.Ref)
_shared_autoscaling = functools.lru_cache(maxsize=1024, typed=True)(model.Autoscaling)


def _scaling(msg: graph_pb2.Scaling, bad: Bad) -> tuple[int | None, model.Autoscaling | None]:
    fixed = msg.num_replicas if msg.HasField("num_replicas") else None
    if fixed is not None and msg.HasField("autoscaling"):
        bad("scaling", "num_replicas and autoscaling are exclusive; set one")
        return None, None
    if fixed is not None and fixed < 1:
        bad("scaling.num_replicas", "must be ≥ 1")
    if not msg.HasField("autoscaling"):
        return fixed, None
    a = msg.autoscaling
    if a.max_replicas < 1:
        bad("scaling.autoscaling.max_replicas", "must be ≥ 1")
    if a.min_replicas > a.max_replicas:
        bad(
            "scaling.autoscaling.min_replicas",
            f"{a.min_replicas} is greater than max_replicas {a.max_replicas}",
        )
    if a.initial_replicas and not a.min_replicas <= a.initial_replicas <= a.max_replicas:
        bad(
            "scaling.autoscaling.initial_replicas",
            f"{a.initial_replicas} is outside [min_replicas, max_replicas]",
        )
    for field in ("target_ongoing_requests", "upscale_delay_s", "downscale_delay_s"):
        if not _finite_non_negative(getattr(a, field)):
            bad(f"scaling.autoscaling.{field}", "must be a finite number ≥ 0")
    return None, _shared_autoscaling(
        a.min_replicas,
        a.max_replicas,
        a.initial_replicas or None,
        a.target_ongoing_requests or None,
        a.upscale_delay_s or None,
        a.downscale_delay_s or None,
    )


def _finite_non_negative(x: float) -> bool:
    return 0 <= x < math.inf  # False for NaN too


class _NotFinite(ValueError):
    """A NaN or infinity in a protobuf Value, which JSON (and so Serve's config) cannot carry."""


_NOT_FINITE = "NaN or infinite numbers cannot be sent as JSON"


def _value(v: struct_pb2.Value) -> model.JSON:
    """protobuf Value to JSON; whole numbers become ints (Value has only doubles)."""
    which = v.WhichOneof("kind")
    if which == "number_value":
        n = v.number_value
        if n.is_integer():
            return int(n) if abs(n) < _MAX_SAFE_INT else n
        if not -math.inf < n < math.inf:  # NaN and ±inf
            raise _NotFinite
        return n
    if which == "string_value":
        return v.string_value
    if which == "bool_value":
        return v.bool_value
    if which == "struct_value":
        return _struct(v.struct_value)
    if which == "list_value":
        return [_value(x) for x in v.list_value.values]
    return None


# Protobuf maps here and above are read by key: their `.items()` is a Python-level
# view over the map, a third slower than iterating the keys and indexing.
def _struct(s: struct_pb2.Struct) -> dict[str, model.JSON]:
    fields = s.fields
    return {k: _value(fields[k]) for k in sorted(fields)}
