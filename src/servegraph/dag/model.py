"""The Ray DAG in memory: immutable, typed, standard library only.

One model for the whole flow: the validator builds it from protobuf, the
renderers read it, and the runtime inside Ray decodes its args back into it
(`servegraph.dag.args`). Nothing here imports protobuf, Kubernetes or ray, so
the runtime can load it in a Ray image that has none of servegraph's
dependencies, and the wire schema can evolve behind the validator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from operator import attrgetter
from types import MappingProxyType
from typing import Any, TypeAlias, assert_never

JSON: TypeAlias = Any
"""A JSON-compatible value (None, bool, int, float, str, list, dict)."""


@dataclass(frozen=True, slots=True)
class Constant:
    """A constructor argument given as a plain JSON value."""

    value: JSON


@dataclass(frozen=True, slots=True)
class BoundNode:
    """A constructor argument that is another node, bound into this one: a DAG edge (in the
    wire schema an `Argument` whose `node` is a NodeRef; here the name says what it is)."""

    node: str


Argument: TypeAlias = Constant | BoundNode


@dataclass(frozen=True, slots=True)
class Call:
    """How a router calls one child, i.e. one edge: a timeout per attempt, the attempts
    after a failure, and (ensemble members only) whether the ensemble may answer without it.

    Per edge rather than per node: the same model can be a fast step of one sequence
    and a best-effort member of an ensemble.
    """

    timeout_s: float | None = None
    retries: int = 0
    optional: bool = False


DEFAULT_CALL = Call()
MAX_RETRIES = 10
"""More attempts than this only multiply the load on a node that is already failing."""


class _RouterKind:
    """`calls` holds one Call per edge, in the order of `Node.edges`' declaration
    (steps; members then combiner; cases then default; routes), or nothing when every
    edge is called plainly: normalized here so equal DAGs compare equal."""

    calls: tuple[Call, ...]

    def __post_init__(self) -> None:
        if all(c == DEFAULT_CALL for c in self.calls):
            object.__setattr__(self, "calls", ())

    def call(self, index: int) -> Call:
        """The Call of the edge at `index` (in declaration order)."""
        return self.calls[index] if self.calls else DEFAULT_CALL


@dataclass(frozen=True, slots=True)
class DeploymentKind:
    import_path: str
    args: tuple[Argument, ...] = ()
    kwargs: tuple[tuple[str, Argument], ...] = ()
    streaming: bool = False
    """Its `__call__` is a generator: routers call it with `stream=True` (`dag.streams`)."""


@dataclass(frozen=True, slots=True)
class SequenceKind(_RouterKind):
    steps: tuple[str, ...]
    calls: tuple[Call, ...] = ()


@dataclass(frozen=True, slots=True)
class EnsembleKind(_RouterKind):
    members: tuple[str, ...]
    combiner: str | None = None
    calls: tuple[Call, ...] = ()


@dataclass(frozen=True, slots=True)
class SwitchKind(_RouterKind):
    cases: tuple[tuple[str, str], ...]
    default: str
    field: str | None = None
    header: str | None = None
    calls: tuple[Call, ...] = ()


@dataclass(frozen=True, slots=True)
class SplitterKind(_RouterKind):
    routes: tuple[tuple[str, int], ...]
    calls: tuple[Call, ...] = ()


RouterKind: TypeAlias = SequenceKind | EnsembleKind | SwitchKind | SplitterKind
"""Every kind but a deployment: a node that calls the nodes it names. A `match` on a kind ends
in `case _: assert_never(kind)`, so mypy names each module a new kind must be taught
(tests/unit/test_node_kinds.py)."""
NodeKind: TypeAlias = DeploymentKind | RouterKind


@dataclass(frozen=True, slots=True)
class Resources:
    """Per-replica resources; None means Ray Serve's default."""

    num_cpus: float | None = None
    num_gpus: float = 0.0
    memory_bytes: int = 0
    custom: tuple[tuple[str, float], ...] = ()
    accelerator_type: str | None = None

    @property
    def cpus(self) -> float:
        """CPUs Ray reserves per replica (Ray Serve's default is 1)."""
        return 1.0 if self.num_cpus is None else self.num_cpus


@dataclass(frozen=True, slots=True)
class Autoscaling:
    min_replicas: int
    max_replicas: int
    initial_replicas: int | None = None
    target_ongoing_requests: float | None = None
    upscale_delay_s: float | None = None
    downscale_delay_s: float | None = None


@dataclass(frozen=True, slots=True)
class Node:
    id: str
    kind: NodeKind
    resources: Resources = Resources()
    num_replicas: int | None = None
    autoscaling: Autoscaling | None = None
    max_ongoing_requests: int | None = None
    max_queued_requests: int | None = None
    user_config: Mapping[str, JSON] | None = None
    health_check_period_s: float | None = None
    health_check_timeout_s: float | None = None
    graceful_shutdown_wait_loop_s: float | None = None
    graceful_shutdown_timeout_s: float | None = None
    max_replicas_per_node: int | None = None

    @property
    def edges(self) -> tuple[str, ...]:
        """Ids of the nodes this node depends on, in declaration order, without repeats."""
        children = _children(self.kind)
        return tuple(dict.fromkeys(children)) if len(children) > 1 else tuple(children)

    @property
    def replica_range(self) -> tuple[int, int, int]:
        """(min, initial, max) replicas; fixed scaling has all three equal."""
        if self.autoscaling is not None:
            a = self.autoscaling
            initial = a.min_replicas if a.initial_replicas is None else a.initial_replicas
            return a.min_replicas, initial, a.max_replicas
        n = 1 if self.num_replicas is None else self.num_replicas
        return n, n, n


def _children(kind: NodeKind) -> list[str]:
    match kind:
        case DeploymentKind(args=args, kwargs=kwargs):
            found = [a.node for a in args if isinstance(a, BoundNode)]
            if kwargs:
                found += [v.node for _, v in kwargs if isinstance(v, BoundNode)]
            return found
        case SequenceKind(steps=steps):
            return list(steps)
        case EnsembleKind(members=members, combiner=combiner):
            return [*members, *([combiner] if combiner else [])]
        case SwitchKind(cases=cases, default=default):
            return [n for _, n in cases] + [default]
        case SplitterKind(routes=routes):
            return [n for n, _ in routes]
        case _:
            assert_never(kind)


@dataclass(frozen=True, slots=True)
class RuntimeEnv:
    pip: tuple[str, ...] = ()
    env_vars: tuple[tuple[str, str], ...] = ()
    working_dir: str | None = None
    py_modules: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.pip or self.env_vars or self.working_dir or self.py_modules)


@dataclass(frozen=True, slots=True)
class Telemetry:
    """What an application's routers record and forward (the trace context always)."""

    forward_headers: tuple[str, ...] = ()
    """Lower-cased request header names routers pass on to every downstream node."""
    metrics: bool = True


@dataclass(frozen=True, slots=True)
class Application:
    name: str
    route_prefix: str
    ingress: str
    nodes: Mapping[str, Node]
    order: tuple[str, ...]
    """Node ids in topological order: dependencies first, ties broken by id."""
    runtime_env: RuntimeEnv = RuntimeEnv()
    telemetry: Telemetry = Telemetry()
    grpc_servicer_functions: tuple[str, ...] = ()
    """Import paths of the application's own gRPC servicer functions, besides GraphService's."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", MappingProxyType(dict(self.nodes)))

    def ordered_nodes(self) -> tuple[Node, ...]:
        return tuple(self.nodes[i] for i in self.order)


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None


@dataclass(frozen=True, slots=True)
class NodeRequirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PreferredNodes:
    weight: int
    match: tuple[NodeRequirement, ...]


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a worker group's pods may run, beyond its node selector: Kubernetes'
    tolerations, node affinity and priority class, as the graph's hint sets them."""

    tolerations: tuple[Toleration, ...] = ()
    required: tuple[tuple[NodeRequirement, ...], ...] = ()
    """Node selector terms, any of which a node must match (each one: all its requirements)."""
    preferred: tuple[PreferredNodes, ...] = ()
    priority_class_name: str | None = None


@dataclass(frozen=True, slots=True)
class WorkerGroupHint:
    name: str | None = None
    gpu: bool = False
    accelerator_type: str | None = None
    cpus_per_worker: float | None = None
    gpus_per_worker: int | None = None
    memory_bytes_per_worker: int | None = None
    max_workers: int | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    placement: Placement = Placement()


@dataclass(frozen=True, slots=True)
class ClusterHints:
    ray_version: str | None = None
    image: str | None = None
    worker_groups: tuple[WorkerGroupHint, ...] = ()


@dataclass(frozen=True, slots=True, weakref_slot=True)
class Graph:
    name: str
    version: str
    schema_version: int
    applications: tuple[Application, ...]
    cluster: ClusterHints = ClusterHints()
    labels: tuple[tuple[str, str], ...] = field(default=())

    @property
    def node_count(self) -> int:
        return sum(len(a.nodes) for a in self.applications)


def _reduce_by_fields(cls: type, thawed: str | None = None) -> None:
    """Pickle as (class, field values): a parse child sends every graph back this way.

    dataclass(slots=True) pickles each object by calling `fields()` on it, and a tenant's
    graph is a few hundred of them: that was ~0.66 ms to pickle and ~0.79 ms to unpickle a
    59-node graph (a fifth of its parse again). The field names are read once here instead,
    still from the dataclass, so a new field cannot be left out (one once was: an
    application's telemetry reset to its default in the operator). `thawed` names a field
    held as a read-only view, which cannot be pickled: it goes as a dict.
    """
    names = tuple(f.name for f in fields(cls))
    get = attrgetter(*names)
    if thawed is not None:
        at = names.index(thawed)

        def reduce(self: Any) -> tuple[type, tuple[Any, ...]]:
            values = list(get(self))
            values[at] = dict(values[at])
            return (cls, tuple(values))

    elif len(names) == 1:  # attrgetter of one name gives the value, not a tuple

        def reduce(self: Any) -> tuple[type, tuple[Any, ...]]:
            return (cls, (get(self),))

    else:

        def reduce(self: Any) -> tuple[type, tuple[Any, ...]]:
            return (cls, get(self))

    cls.__reduce__ = reduce  # type: ignore[method-assign,assignment]


for _cls in [v for v in list(globals().values()) if isinstance(v, type) and is_dataclass(v)]:
    if _cls.__module__ == __name__:
        _reduce_by_fields(_cls, "nodes" if _cls is Application else None)
