"""One node of a graph message to the model: kind, arguments, resources, scaling, options.

Split from `validate` so each reads on its own: this module reads a node message;
`validate` knows how nodes make applications and applications a graph. What a node's
kind may say is `servegraph.dag.rules`, shared with the runtime's reader of the Serve
config: here are only the checks of what the model does not hold (argument values,
call options on a handle, resources, scaling). Problems are collected, never raised,
so the validator can report all of them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

from google.protobuf import struct_pb2

from servegraph.dag import model
from servegraph.dag.rules import node_problems
from servegraph.graph.errors import Problem, where
from servegraph.graph.limits import MAX_INT32, MAX_MEMORY_BYTES
from servegraph.v1 import graph_pb2

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

    kind = _kind(msg, bad, budget)
    for field, problem in node_problems(node_id, kind):
        bad(field, problem)
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
        args = tuple([_argument(a, "deployment.args", i, bad, budget) for i, a in enumerate(d.args)])
        kwargs: tuple[tuple[str, model.Argument], ...] = ()
        if d.kwargs:
            given = d.kwargs
            kwargs = tuple([(k, _argument(given[k], "deployment.kwargs", k, bad, budget)) for k in sorted(given)])
        return model.DeploymentKind(import_path=d.import_path, args=args, kwargs=kwargs, streaming=d.streaming)
    if which == "sequence":
        steps = [_edge(r) for r in msg.sequence.steps]
        return model.SequenceKind(steps=tuple(i for i, _ in steps), calls=tuple(c for _, c in steps))
    if which == "ensemble":
        e = msg.ensemble
        edges = [_edge(r) for r in e.members]
        members = tuple(i for i, _ in edges)
        combiner = None
        if e.HasField("combiner"):
            combiner, call = _edge(e.combiner)
            edges.append((combiner, call))
        return model.EnsembleKind(members=members, combiner=combiner, calls=tuple(c for _, c in edges))
    if which == "switch":
        s = msg.switch
        on = s.WhichOneof("on")
        cases = []
        calls = []
        for c in s.cases:
            target, call = _edge(c.node)
            cases.append((c.equals, target))
            calls.append(call)
        default, call = _edge(s.default) if s.HasField("default") else ("", model.DEFAULT_CALL)
        return model.SwitchKind(
            cases=tuple(cases),
            default=default,
            field=s.field if on == "field" else None,
            header=s.header.lower() if on == "header" else None,
            calls=(*calls, call),
        )
    if which != "splitter":  # graph.proto has a kind this reader does not know (tests/unit/test_node_kinds.py)
        raise AssertionError(f"node kind {which!r} of graph.proto is not read by graph/nodes.py")
    split = [(_edge(r.node), r.weight) for r in msg.splitter.routes]
    routes = tuple((target, weight) for (target, _), weight in split)
    return model.SplitterKind(routes=routes, calls=tuple(call for (_, call), _ in split))


def _edge(ref: graph_pb2.NodeRef) -> tuple[str, model.Call]:
    """A router's child: its id and how the router calls it (a timeout of 0 is none)."""
    timeout, retries, optional = ref.timeout_s, ref.retries, ref.optional
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
    if msg.memory_bytes > MAX_MEMORY_BYTES:
        bad("resources.memory_bytes", f"{msg.memory_bytes} is over the limit of {MAX_MEMORY_BYTES} (4Ei)")
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
_shared_ref = functools.lru_cache(maxsize=1 << 14)(model.BoundNode)
_shared_autoscaling = functools.lru_cache(maxsize=1024, typed=True)(model.Autoscaling)
_shared_call = functools.lru_cache(maxsize=1024, typed=True)(model.Call)


def _scaling(msg: graph_pb2.Scaling, bad: Bad) -> tuple[int | None, model.Autoscaling | None]:
    fixed = msg.num_replicas if msg.HasField("num_replicas") else None
    if fixed is not None and msg.HasField("autoscaling"):
        bad("scaling", "num_replicas and autoscaling are exclusive; set one")
        return None, None
    if fixed is not None and fixed < 1:
        bad("scaling.num_replicas", "must be ≥ 1")
    if fixed is not None and fixed > MAX_INT32:
        bad("scaling.num_replicas", _over_int32(fixed))
    if not msg.HasField("autoscaling"):
        return fixed, None
    a = msg.autoscaling
    for field in ("min_replicas", "max_replicas", "initial_replicas"):
        if getattr(a, field) > MAX_INT32:
            bad(f"scaling.autoscaling.{field}", _over_int32(getattr(a, field)))
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


def _over_int32(count: int) -> str:
    return f"{count} is over the limit of {MAX_INT32} (KubeRay's replica counts are int32)"


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
