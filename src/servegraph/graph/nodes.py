"""One node of a graph message to the model: kind, arguments, resources, scaling, options.

Split from `validate` so each reads on its own: this module knows what a node
may say; `validate` knows how nodes make applications and applications a graph.
Problems are collected, never raised, so the validator can report all of them.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from google.protobuf import struct_pb2

from servegraph.dag import model
from servegraph.graph.errors import Problem, where
from servegraph.v1 import graph_pb2

NODE_ID = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
"""A deployment name Ray accepts: also the rule for application names."""
# `module.path:attr` or `module.attr`: the language of `ident(\.ident)*[:.]ident[\w.]*`,
# which on a failing match tries every split of the dots (32 KB took 7 s; 16 MB, hours).
_IMPORT_PATH = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_.]*|(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_.]*)$"
)
_RESERVED_RESOURCES = frozenset({"CPU", "GPU", "memory", "object_store_memory"})
_MAX_SAFE_INT = 2**53
MAX_STRING = 64 * 1024
"""Characters in any one string a node carries (import path, argument, user_config)."""
MAX_VALUES = 200_000
"""JSON values in all user_configs and constant arguments of a graph: what the operator
holds in memory and copies across processes, whatever the bytes on the wire."""

Bad = Callable[[str | None, str], None]


@dataclass
class Budget:
    """What the rest of one graph may still hold; shared by all its nodes."""

    values: int = MAX_VALUES


def to_node(
    app: str, node_id: str, msg: graph_pb2.Node, problems: list[Problem], budget: Budget | None = None
) -> model.Node | None:
    add = problems.append
    before = len(problems)
    budget = budget if budget is not None else Budget()

    def bad(field: str | None, message: str) -> None:
        add(Problem(where(app=app, node=node_id, field=field), message))

    if not NODE_ID.fullmatch(node_id):
        bad(
            None,
            "id is not a deployment name Ray accepts here: 1-63 letters, digits, '-', '_' or '.' (no '#'), starting and ending with a letter or digit",
        )
    kind = _kind(msg, bad, budget)
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
        if not finite_non_negative(value):
            bad(name, "must be a finite number ≥ 0")
    if msg.max_queued_requests < -1:
        bad("max_queued_requests", "must be -1 (no limit), 0 (default) or positive")
    user_config = None
    if msg.HasField("user_config") and kind is not None and not isinstance(kind, model.DeploymentKind):
        # A router's user_config carries the graph's version (render.serve_config): it has no
        # other use, and Ray would fail a router class given one it does not expect.
        bad("user_config", "only deployment nodes take a user_config; a router has none")
    elif msg.HasField("user_config"):
        try:
            user_config = _struct(msg.user_config, budget)
        except _Unfit as exc:
            bad("user_config", exc.message)
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


def _kind(msg: graph_pb2.Node, bad: Bad, budget: Budget) -> model.NodeKind | None:
    which = msg.WhichOneof("kind")
    if which is None:
        bad(None, "no kind set; set one of deployment, sequence, ensemble, switch, splitter")
        return None
    if which == "deployment":
        d = msg.deployment
        if len(d.import_path) > 1024:
            bad("deployment.import_path", f"{len(d.import_path)} characters, over the limit of 1024")
        elif not _IMPORT_PATH.fullmatch(d.import_path):
            bad(
                "deployment.import_path",
                f"{d.import_path!r} is not of the form 'module.path:attribute'",
            )
        args = tuple([_argument(a, "deployment.args", i, bad, budget) for i, a in enumerate(d.args)])
        kwargs: tuple[tuple[str, model.Argument], ...] = ()
        if d.kwargs:
            given = d.kwargs
            kwargs = tuple([(k, _argument(given[k], "deployment.kwargs", k, bad, budget)) for k in sorted(given)])
            for k, _ in kwargs:
                if not k.isidentifier():
                    bad(f"deployment.kwargs[{k!r}]", "not a Python identifier")
        return model.DeploymentKind(import_path=d.import_path, args=args, kwargs=kwargs)
    if which == "sequence":
        steps = [_edge(r, f"sequence.steps[{i}]", bad) for i, r in enumerate(msg.sequence.steps)]
        if not steps:
            bad("sequence.steps", "a sequence needs at least one step")
        return model.SequenceKind(steps=tuple(i for i, _ in steps), calls=tuple(c for _, c in steps))
    if which == "ensemble":
        e = msg.ensemble
        edges = [_edge(r, f"ensemble.members[{i}]", bad, optional_allowed=True) for i, r in enumerate(e.members)]
        members = tuple(i for i, _ in edges)
        if not members:
            bad("ensemble.members", "an ensemble needs at least one member")
        if len(set(members)) != len(members):
            bad("ensemble.members", "a member is listed twice")
        combiner = None
        if e.HasField("combiner"):
            combiner, call = _edge(e.combiner, "ensemble.combiner", bad)
            edges.append((combiner, call))
        if combiner is not None and combiner in members:
            bad("ensemble.combiner", f'"{combiner}" is also a member')
        return model.EnsembleKind(members=members, combiner=combiner, calls=tuple(c for _, c in edges))
    if which == "switch":
        s = msg.switch
        on = s.WhichOneof("on")
        if on is None or not getattr(s, on):
            bad("switch", "set `field` (a JSON body key) or `header` to route on")
        cases = []
        calls = []
        seen: set[str] = set()
        for i, c in enumerate(s.cases):
            if c.equals in seen:
                bad(f"switch.cases[{i}].equals", f"{c.equals!r} appears in an earlier case")
            seen.add(c.equals)
            target, call = _edge(c.node, f"switch.cases[{i}].node", bad)
            cases.append((c.equals, target))
            calls.append(call)
        if not s.HasField("default"):
            bad("switch.default", "missing; name the node taking requests that match no case")
        default, call = _edge(s.default, "switch.default", bad) if s.HasField("default") else ("", model.DEFAULT_CALL)
        return model.SwitchKind(
            cases=tuple(cases),
            default=default,
            field=s.field if on == "field" else None,
            header=s.header.lower() if on == "header" else None,
            calls=(*calls, call),
        )
    s_msg = msg.splitter
    split = [(_edge(r.node, f"splitter.routes[{i}].node", bad), r.weight) for i, r in enumerate(s_msg.routes)]
    routes = tuple((target, weight) for (target, _), weight in split)
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
    return model.SplitterKind(routes=routes, calls=tuple(call for (_, call), _ in split))


def _edge(ref: graph_pb2.NodeRef, field: str, bad: Bad, *, optional_allowed: bool = False) -> tuple[str, model.Call]:
    """A router's child: its id and how the router calls it."""
    if not ref.id:
        bad(field, "empty node reference")
    timeout, retries, optional = ref.timeout_s, ref.retries, ref.optional
    if not finite_non_negative(timeout):
        bad(f"{field}.timeout_s", f"must be a finite number of seconds ≥ 0 (0: no timeout), got {timeout}")
        timeout = 0.0
    if retries > model.MAX_RETRIES:
        bad(f"{field}.retries", f"{retries} retries; at most {model.MAX_RETRIES}")
    if optional and not optional_allowed:
        bad(f"{field}.optional", "only an ensemble's members may be optional (the others' output is the result)")
    if not (timeout or retries or optional):
        return ref.id, model.DEFAULT_CALL
    return ref.id, _shared_call(timeout or None, retries, optional)


def _no_call_options(ref: graph_pb2.NodeRef, field: str, bad: Bad) -> None:
    """A handle bound into user code is called by that code: timeouts and retries there would not apply."""
    for name in ("timeout_s", "retries", "optional"):
        if getattr(ref, name):
            bad(f"{field}.{name}", "only a router's edges take call options; user code calls its handles itself")


def _argument(arg: graph_pb2.Argument, prefix: str, key: int | str, bad: Bad, budget: Budget) -> model.Argument:
    """One constructor argument; the field path is only formatted for a problem."""
    which = arg.WhichOneof("kind")
    if which == "node":
        ref = arg.node
        node = ref.id
        if not node:
            bad(f"{prefix}[{key!r}].node", "empty node reference")
        if ref.timeout_s or ref.retries or ref.optional:
            _no_call_options(ref, f"{prefix}[{key!r}].node", bad)
        return _shared_ref(node)
    if which is None:
        bad(f"{prefix}[{key!r}]", "neither a value nor a node reference")
        return model.Constant(None)
    try:
        return model.Constant(_value(arg.value, budget))
    except _Unfit as exc:
        bad(f"{prefix}[{key!r}]", exc.message)
        return model.Constant(None)


def _resources(msg: graph_pb2.Resources, bad: Bad) -> model.Resources:
    cpus, gpus, accelerator = msg.num_cpus, msg.num_gpus, msg.accelerator_type
    for name, amount in (("num_cpus", cpus), ("num_gpus", gpus)):
        if not finite_non_negative(amount):
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
_shared_ref = functools.lru_cache(maxsize=1 << 14)(model.NodeRef)
_shared_autoscaling = functools.lru_cache(maxsize=1024, typed=True)(model.Autoscaling)
_shared_call = functools.lru_cache(maxsize=1024, typed=True)(model.Call)


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
        if not finite_non_negative(getattr(a, field)):
            bad(f"scaling.autoscaling.{field}", "must be a finite number ≥ 0")
    return None, _shared_autoscaling(
        a.min_replicas,
        a.max_replicas,
        a.initial_replicas or None,
        a.target_ongoing_requests or None,
        a.upscale_delay_s or None,
        a.downscale_delay_s or None,
    )


def finite_non_negative(x: float) -> bool:
    return 0 <= x < math.inf  # False for NaN too


class _Unfit(ValueError):
    """A protobuf Value the graph cannot carry: not JSON, or over a limit."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


_NOT_FINITE = "NaN or infinite numbers cannot be sent as JSON"


def _value(v: struct_pb2.Value, budget: Budget) -> model.JSON:
    """protobuf Value to JSON; whole numbers become ints (Value has only doubles)."""
    budget.values -= 1
    if budget.values < 0:
        raise _Unfit(f"the graph holds more than {MAX_VALUES} values in user_config and arguments")
    which = v.WhichOneof("kind")
    if which == "number_value":
        n = v.number_value
        if n.is_integer():
            return int(n) if abs(n) < _MAX_SAFE_INT else n
        if not -math.inf < n < math.inf:  # NaN and ±inf
            raise _Unfit(_NOT_FINITE)
        return n
    if which == "string_value":
        text = v.string_value
        if len(text) > MAX_STRING:
            raise _Unfit(f"a string of {len(text)} characters, over the limit of {MAX_STRING}")
        return text
    if which == "bool_value":
        return v.bool_value
    if which == "struct_value":
        return _struct(v.struct_value, budget)
    if which == "list_value":
        return [_value(x, budget) for x in v.list_value.values]
    return None


# Protobuf maps here and above are read by key: their `.items()` is a Python-level
# view over the map, a third slower than iterating the keys and indexing.
def _struct(s: struct_pb2.Struct, budget: Budget) -> dict[str, model.JSON]:
    fields = s.fields
    if len(fields) > budget.values:
        raise _Unfit(f"the graph holds more than {MAX_VALUES} values in user_config and arguments")
    for key in fields:
        if len(key) > MAX_STRING:
            raise _Unfit(f"a key of {len(key)} characters, over the limit of {MAX_STRING}")
    return {k: _value(fields[k], budget) for k in sorted(fields)}
