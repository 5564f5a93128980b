"""The Ray DAG in memory: immutable, typed, free of protobuf, Kubernetes and ray.

Everything downstream (renderers, the operator's status, `servegraph inspect`)
reads this model, never the protobuf messages, so the wire schema can evolve
behind the validator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeAlias

JSON: TypeAlias = Any
"""A JSON-compatible value (None, bool, int, float, str, list, dict)."""


@dataclass(frozen=True)
class Literal:
    """A constructor argument given as a plain value."""

    value: JSON


@dataclass(frozen=True)
class Ref:
    """A constructor argument or router child that is another node: a DAG edge."""

    node: str


Argument: TypeAlias = Literal | Ref


@dataclass(frozen=True)
class DeploymentKind:
    import_path: str
    args: tuple[Argument, ...] = ()
    kwargs: tuple[tuple[str, Argument], ...] = ()


@dataclass(frozen=True)
class SequenceKind:
    steps: tuple[str, ...]


@dataclass(frozen=True)
class EnsembleKind:
    members: tuple[str, ...]
    combiner: str | None = None


@dataclass(frozen=True)
class SwitchKind:
    cases: tuple[tuple[str, str], ...]
    default: str
    field: str | None = None
    header: str | None = None


@dataclass(frozen=True)
class SplitterKind:
    routes: tuple[tuple[str, int], ...]


NodeKind: TypeAlias = DeploymentKind | SequenceKind | EnsembleKind | SwitchKind | SplitterKind


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Autoscaling:
    min_replicas: int
    max_replicas: int
    initial_replicas: int | None = None
    target_ongoing_requests: float | None = None
    upscale_delay_s: float | None = None
    downscale_delay_s: float | None = None


@dataclass(frozen=True)
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
        return tuple(dict.fromkeys(_children(self.kind)))

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
            values = [*args, *(v for _, v in kwargs)]
            return [a.node for a in values if isinstance(a, Ref)]
        case SequenceKind(steps=steps):
            return list(steps)
        case EnsembleKind(members=members, combiner=combiner):
            return [*members, *([combiner] if combiner else [])]
        case SwitchKind(cases=cases, default=default):
            return [n for _, n in cases] + [default]
        case SplitterKind(routes=routes):
            return [n for n, _ in routes]


@dataclass(frozen=True)
class RuntimeEnv:
    pip: tuple[str, ...] = ()
    env_vars: tuple[tuple[str, str], ...] = ()
    working_dir: str | None = None
    py_modules: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.pip or self.env_vars or self.working_dir or self.py_modules)


@dataclass(frozen=True)
class Application:
    name: str
    route_prefix: str
    ingress: str
    nodes: Mapping[str, Node]
    order: tuple[str, ...]
    """Node ids in topological order: dependencies first, ties broken by id."""
    runtime_env: RuntimeEnv = RuntimeEnv()

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", MappingProxyType(dict(self.nodes)))

    def ordered_nodes(self) -> tuple[Node, ...]:
        return tuple(self.nodes[i] for i in self.order)


@dataclass(frozen=True)
class WorkerGroupHint:
    name: str | None = None
    gpu: bool = False
    accelerator_type: str | None = None
    cpus_per_worker: float | None = None
    gpus_per_worker: int | None = None
    memory_bytes_per_worker: int | None = None
    max_workers: int | None = None
    node_selector: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ClusterHints:
    ray_version: str | None = None
    image: str | None = None
    worker_groups: tuple[WorkerGroupHint, ...] = ()


@dataclass(frozen=True)
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
