"""Human views of a DAG: a text summary and a Graphviz digraph (pure)."""

from __future__ import annotations

import json

from servegraph.dag import model
from servegraph.dag.args import refs
from servegraph.dag.streams import streaming_outputs
from servegraph.dag.text import call_text, kind_label, kind_text
from servegraph.graph.workers import GiB, plan_worker_groups


def _resources(node: model.Node) -> str:
    r = node.resources
    parts = [f"cpu={r.cpus:g}"]
    if r.num_gpus:
        parts.append(f"gpu={r.num_gpus:g}" + (f" ({r.accelerator_type})" if r.accelerator_type else ""))
    if r.memory_bytes:
        parts.append(f"mem={r.memory_bytes / GiB:g}Gi")
    parts += [f"{k}={v:g}" for k, v in r.custom]
    lo, initial, hi = node.replica_range
    replicas = f"replicas={lo}" if node.autoscaling is None else f"replicas={lo}..{hi} (start {initial})"
    return " ".join([replicas, *parts])


def _call_notes(node: model.Node) -> dict[str, str]:
    """`timeout 0.5s, retries 1, optional` by child, for router edges called with options."""
    kind = node.kind
    if isinstance(kind, model.DeploymentKind):
        return {}
    notes: dict[str, str] = {}
    for i, (_, child) in enumerate(refs(kind)):
        text = call_text(kind.call(i))
        if text:
            notes.setdefault(child, text)
    return notes


def describe(graph: model.Graph) -> str:
    lines = [
        f"graph {graph.name} version {graph.version!r} (schema {graph.schema_version}): "
        f"{len(graph.applications)} applications, {graph.node_count} nodes"
    ]
    for app in graph.applications:
        lines.append(f"application {app.name}  route {app.route_prefix}  ingress {app.ingress}")
        if app.telemetry.forward_headers:
            lines.append(f"  forwards headers {', '.join(app.telemetry.forward_headers)}")
        if not app.telemetry.metrics:
            lines.append("  router metrics off")
        streaming = streaming_outputs({n.id: n.kind for n in app.nodes.values()}, app.order)
        for node in app.ordered_nodes():
            lines.append(f"  node {node.id}: {kind_label(node.kind, node.id in streaming)}  [{_resources(node)}]")
            notes = _call_notes(node)
            for child in node.edges:
                note = ", ".join(x for x in ("stream" if child in streaming else "", notes.get(child, "")) if x)
                lines.append(f"    -> {child}" + (f"  ({note})" if note else ""))
    lines.append("worker groups")
    for plan in plan_worker_groups(graph):
        shape = f"cpu={plan.cpus:g} gpu={plan.gpus} mem={plan.memory_bytes / GiB:g}Gi"
        lines.append(
            f"  {plan.name}: {shape} workers={plan.min_workers}..{plan.max_workers} (start {plan.initial_workers})"
            f"  hosts {', '.join(plan.nodes)}"
        )
        placed = _placement(plan.node_selector, plan.placement)
        if placed:
            lines.append(f"    placed: {placed}")
    return "\n".join(lines) + "\n"


def _placement(selector: tuple[tuple[str, str], ...], p: model.Placement) -> str:
    parts = [f"node selector {', '.join(f'{k}={v}' for k, v in selector)}"] if selector else []
    if p.tolerations:
        what = [f"{t.key or '*'}{'=' + t.value if t.value else ''}:{t.effect or '*'}" for t in p.tolerations]
        parts.append(f"tolerates {', '.join(what)}")
    if p.required or p.preferred:
        parts.append(f"node affinity ({len(p.required)} required terms, {len(p.preferred)} preferred)")
    if p.priority_class_name:
        parts.append(f"priority class {p.priority_class_name}")
    return "; ".join(parts)


def to_dot(graph: model.Graph) -> str:
    """One cluster per application; edges point from a node to what it calls."""
    lines = [f"digraph {json.dumps(graph.name)} {{", "  rankdir=LR;"]
    for i, app in enumerate(graph.applications):
        lines.append(f"  subgraph cluster_{i} {{")
        lines.append(f"    label={json.dumps(app.name + ' ' + app.route_prefix)};")
        for node in app.ordered_nodes():
            shape = "box" if isinstance(node.kind, model.DeploymentKind) else "diamond"
            peripheries = 2 if node.id == app.ingress else 1
            label = f"{node.id}\\n{kind_text(node.kind)}"
            lines.append(
                f'    {json.dumps(app.name + "/" + node.id)} [label="{label}", shape={shape}, peripheries={peripheries}];'
            )
        for node in app.ordered_nodes():
            for child in node.edges:
                lines.append(f"    {json.dumps(app.name + '/' + node.id)} -> {json.dumps(app.name + '/' + child)};")
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"
