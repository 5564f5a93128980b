"""Size the Ray cluster's worker groups from the DAG's resource needs.

Nodes are split into groups by what hardware they need (CPU only, any GPU, a
given accelerator type), each group's pod shape fits its largest replica, and
the worker counts come from the replicas x resources the group must hold at its
minimum, initial and maximum scale. This is an estimate by aggregate demand;
where any node autoscales, KubeRay's in-tree autoscaler adjusts within the
bounds rendered here.

Planning is part of validation (`validate.to_model` runs it): a graph whose
replicas fit no worker cannot become a RayService, so it is refused where every
other mistake is, by `servegraph validate` as by the operator.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from servegraph.dag import model
from servegraph.dag.text import memory_text
from servegraph.graph.errors import GraphError, Problem, where
from servegraph.graph.limits import MAX_INT32, MIN_WORKER_MEMORY_BYTES

GiB = 1024**3
CPU_DEFAULTS = (4.0, 0, 16 * GiB)
GPU_DEFAULTS = (8.0, 1, 32 * GiB)


@dataclass(frozen=True)
class WorkerGroupPlan:
    name: str
    cpus: float
    gpus: int
    memory_bytes: int
    min_workers: int
    initial_workers: int
    max_workers: int
    nodes: tuple[str, ...]
    """`application/node` of every node the group hosts."""
    custom_resources: tuple[tuple[str, float], ...] = ()
    accelerator_type: str | None = None
    node_selector: tuple[tuple[str, str], ...] = ()
    placement: model.Placement = field(default_factory=model.Placement)


@dataclass(frozen=True)
class PodShape:
    """What each worker pod will really offer Ray where the ServeGraph's overrides fix it
    (`spec.rayService.workers.resources`); None leaves that resource to the planner.

    Worker counts are planned for this shape, not for the default pod the overrides then
    shrink: a 1-CPU override gets as many workers as its replicas need.
    """

    cpus: float | None = None
    gpus: int | None = None
    memory_bytes: int | None = None

    def describe(self) -> str:
        parts = [
            f"{what} {value:g}"
            for what, value in (("num_cpus", self.cpus), ("num_gpus", self.gpus))
            if value is not None
        ]
        parts += [] if self.memory_bytes is None else [f"memory {memory_text(self.memory_bytes)}"]
        return ", ".join(parts)


ANY_POD = PodShape()


@dataclass
class _Demand:
    hint: model.WorkerGroupHint
    nodes: list[tuple[str, model.Node]]


def plan_worker_groups(graph: model.Graph, pods: PodShape = ANY_POD) -> tuple[WorkerGroupPlan, ...]:
    """One plan per group that hosts at least one node, in a stable order.

    `pods` is what the overrides fix of every worker pod; a replica bigger than that is a
    problem naming the node, its need and the pod size.
    """
    groups: dict[str, _Demand] = {}
    # Nodes with the same hardware class land in the same group: look it up once per class.
    by_class: dict[tuple[bool, str | None], _Demand] = {}
    for app in graph.applications:
        for node in app.ordered_nodes():
            r = node.resources
            key = (r.num_gpus > 0, r.accelerator_type)
            demand = by_class.get(key)
            if demand is None:
                hint = _hint_for(graph.cluster.worker_groups, r)
                name = hint.name or _default_name(hint)
                demand = by_class[key] = groups.setdefault(name, _Demand(hint, []))
            demand.nodes.append((app.name, node))
    plans = []
    problems: list[Problem] = []
    for name in sorted(groups):
        plan = _plan(name, groups[name], pods, problems)
        if plan is not None:
            plans.append(plan)
    if problems:
        raise GraphError(problems)
    return tuple(plans)


def uses_autoscaling(graph: model.Graph) -> bool:
    return any(n.autoscaling is not None for a in graph.applications for n in a.nodes.values())


def _hint_for(hints: tuple[model.WorkerGroupHint, ...], r: model.Resources) -> model.WorkerGroupHint:
    needs_gpu = r.num_gpus > 0
    for hint in hints:
        if hint.accelerator_type:
            if hint.accelerator_type == r.accelerator_type:
                return hint
        elif hint.gpu == needs_gpu and not (needs_gpu and r.accelerator_type):
            return hint
    return model.WorkerGroupHint(gpu=needs_gpu, accelerator_type=r.accelerator_type if needs_gpu else None)


def _default_name(hint: model.WorkerGroupHint) -> str:
    if hint.accelerator_type:
        slug = re.sub(r"[^a-z0-9]+", "-", hint.accelerator_type.lower()).strip("-")[:15].strip("-")
        return f"gpu-{slug}" if slug else "gpu"
    return "gpu" if hint.gpu else "cpu"


def _plan(name: str, demand: _Demand, pods: PodShape, problems: list[Problem]) -> WorkerGroupPlan | None:
    hint = demand.hint
    dflt_cpu, dflt_gpu, dflt_mem = GPU_DEFAULTS if hint.gpu else CPU_DEFAULTS
    # What the pod will have, by precedence: the ServeGraph's override (fixed), the graph's
    # hint (fixed), else the default grown to the largest replica.
    fixed_cpus = pods.cpus if pods.cpus is not None else hint.cpus_per_worker
    fixed_gpus = pods.gpus if pods.gpus is not None else hint.gpus_per_worker
    fixed_mem = pods.memory_bytes if pods.memory_bytes is not None else hint.memory_bytes_per_worker
    cpus = fixed_cpus if fixed_cpus is not None else dflt_cpu
    gpus = fixed_gpus if fixed_gpus is not None else dflt_gpu
    mem = fixed_mem if fixed_mem is not None else dflt_mem
    custom: dict[str, float] = {}
    ok = True
    if fixed_mem is not None and fixed_mem < MIN_WORKER_MEMORY_BYTES:
        whose = "the worker pod set by the ServeGraph has" if pods.memory_bytes else "its hint gives each worker"
        problems.append(
            Problem(
                "",
                f'worker group "{name}": {whose} {memory_text(fixed_mem)} of memory, too little for Ray to start '
                f"(at least {memory_text(MIN_WORKER_MEMORY_BYTES)}: its object store takes 30% and needs 75Mi)",
            )
        )
        return None
    for app, node in demand.nodes:
        r = node.resources
        need_cpus, need_gpus, need_mem = r.cpus, r.num_gpus, r.memory_bytes
        # A size that grows starts whole and grows by whole units: it holds a need exactly
        # when it holds the need rounded up, so only a bigger need changes it.
        if fixed_cpus is None and need_cpus > cpus:
            cpus = float(math.ceil(need_cpus))
        if fixed_gpus is None and need_gpus > gpus:
            gpus = math.ceil(need_gpus)
        if fixed_mem is None and need_mem > mem:
            mem = math.ceil(need_mem / GiB) * GiB
        for res, amount in r.custom:
            custom[res] = max(custom.get(res, 0.0), float(math.ceil(amount)))
        if need_cpus <= cpus and need_gpus <= gpus and need_mem <= mem:
            continue
        too_big = [
            f"{what} {need:g} > {have:g}"
            for what, need, have in (("num_cpus", r.cpus, cpus), ("num_gpus", r.num_gpus, gpus))
            if need > have
        ]
        too_big += [f"memory {memory_text(r.memory_bytes)} > {memory_text(mem)}"] if r.memory_bytes > mem else []
        pod = f" (the worker pod set by the ServeGraph: {pods.describe()})" if pods != ANY_POD else ""
        problems.append(
            Problem(
                where(app=app, node=node.id, field="resources"),
                f'one replica does not fit a worker of group "{name}": {", ".join(too_big)}{pod}',
            )
        )
        ok = False
    if not ok:
        return None

    counts = _workers(demand.nodes, cpus, gpus, mem, custom)
    if counts is None:
        problems.append(
            Problem(
                "", f'worker group "{name}": the replicas x resources of its nodes are too large to count workers for'
            )
        )
        return None
    lo, initial, hi = counts
    if hint.max_workers is not None:
        lo, initial, hi = (min(v, hint.max_workers) for v in (lo, initial, hi))
    if hi > MAX_INT32:
        problems.append(
            Problem("", f'worker group "{name}": its replicas need {hi:,} workers, over KubeRay\'s {MAX_INT32:,}')
        )
        return None
    return WorkerGroupPlan(
        name=name,
        cpus=cpus,
        gpus=gpus,
        memory_bytes=mem,
        min_workers=lo,
        initial_workers=initial,
        max_workers=hi,
        nodes=tuple(f"{app}/{node.id}" for app, node in demand.nodes),
        custom_resources=tuple(sorted(custom.items())),
        accelerator_type=hint.accelerator_type,
        node_selector=hint.node_selector,
        placement=hint.placement,
    )


def _workers(
    nodes: list[tuple[str, model.Node]], cpus: float, gpus: int, mem: int, custom: dict[str, float]
) -> tuple[int, int, int] | None:
    """Workers needed at the group's (minimum, initial, maximum) scale, in one pass over its nodes.

    None when replicas x resources overflow a float. The three scales' sums are kept apart
    in plain variables, not indexed lists: this loop runs for every node at every parse and
    render, and indexing was most of its time.
    """
    cpu_lo = cpu_init = cpu_hi = gpu_lo = gpu_init = gpu_hi = mem_lo = mem_init = mem_hi = 0.0
    extra: tuple[dict[str, float], ...] = ({}, {}, {})
    spread = [0, 0, 0]  # workers forced by max_replicas_per_node
    for _, node in nodes:
        r = node.resources
        cpu, gpu, memory = r.cpus, r.num_gpus, r.memory_bytes
        lo, init, hi = node.replica_range
        cpu_lo += lo * cpu
        cpu_init += init * cpu
        cpu_hi += hi * cpu
        gpu_lo += lo * gpu
        gpu_init += init * gpu
        gpu_hi += hi * gpu
        mem_lo += lo * memory
        mem_init += init * memory
        mem_hi += hi * memory
        if r.custom or node.max_replicas_per_node:
            for scale, replicas in enumerate((lo, init, hi)):
                for res, amount in r.custom:
                    extra[scale][res] = extra[scale].get(res, 0.0) + replicas * amount
                if node.max_replicas_per_node and replicas:
                    spread[scale] = max(spread[scale], math.ceil(replicas / node.max_replicas_per_node))
    out = []
    sums = ((cpu_lo, gpu_lo, mem_lo), (cpu_init, gpu_init, mem_init), (cpu_hi, gpu_hi, mem_hi))
    for scale, (cpu_sum, gpu_sum, memory_sum) in enumerate(sums):
        ratios = [cpu_sum / cpus if cpus else 0.0, gpu_sum / gpus if gpus else 0.0, memory_sum / mem]
        ratios += [amount / custom[res] for res, amount in extra[scale].items()]
        worst = max(ratios)
        if not math.isfinite(worst):
            return None
        out.append(max(spread[scale], math.ceil(worst - 1e-9)))
    return out[0], out[1], out[2]
