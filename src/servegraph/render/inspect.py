"""Human views of a DAG: a text summary, the same as data, and a Graphviz digraph (pure)."""

from __future__ import annotations

import json
from typing import Any, assert_never

from servegraph.dag import model
from servegraph.dag.args import refs
from servegraph.dag.streams import streaming_outputs
from servegraph.dag.text import call_text, kind_label, kind_text, memory_text
from servegraph.graph.workers import WorkerGroupPlan, plan_worker_groups


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _resources(node: model.Node) -> str:
    r = node.resources
    parts = [f"cpu={r.cpus:g}"]
    if r.num_gpus:
        parts.append(f"gpu={r.num_gpus:g}" + (f" ({r.accelerator_type})" if r.accelerator_type else ""))
    if r.memory_bytes:
        parts.append(f"mem={memory_text(r.memory_bytes)}")
    parts += [f"{k}={v:g}" for k, v in r.custom]
    lo, initial, hi = node.replica_range
    replicas = f"replicas={lo}" if node.autoscaling is None else f"replicas={lo}..{hi} (start {initial})"
    return " ".join([replicas, *parts])


def _edge_labels(node: model.Node) -> dict[str, str]:
    """What each edge of a router is, by child: `step 1`, `= 'fast'`, `default`, `90%`, `combiner`."""
    kind = node.kind
    labels: list[str]
    match kind:
        case model.SequenceKind():
            labels = [f"step {i + 1}" for i in range(len(kind.steps))]
        case model.EnsembleKind():
            labels = [""] * len(kind.members) + (["combiner"] if kind.combiner else [])
        case model.SwitchKind():
            labels = [f"= {equals!r}" for equals, _ in kind.cases] + ["default"]
        case model.SplitterKind():
            labels = [f"{weight}%" for _, weight in kind.routes]
        case model.DeploymentKind():
            return {}
        case _:
            assert_never(kind)
    out: dict[str, str] = {}
    for label, (_, child) in zip(labels, refs(kind), strict=True):
        if label:
            out[child] = f"{out[child]} | {label}" if child in out else label
    return out


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


def _streaming(app: model.Application) -> frozenset[str]:
    return streaming_outputs({n.id: n.kind for n in app.nodes.values()}, app.order)


def _edge_note(node: model.Node, child: str, streaming: frozenset[str]) -> str:
    notes = _call_notes(node)
    return ", ".join(x for x in ("stream" if child in streaming else "", notes.get(child, "")) if x)


def describe(graph: model.Graph) -> str:
    lines = [
        f"graph {graph.name} version {graph.version!r} (schema {graph.schema_version}): "
        f"{_plural(len(graph.applications), 'application')}, {_plural(graph.node_count, 'node')}"
    ]
    for app in graph.applications:
        lines.append(f"application {app.name}  route {app.route_prefix}  ingress {app.ingress}")
        if app.telemetry.forward_headers:
            lines.append(f"  forwards headers {', '.join(app.telemetry.forward_headers)}")
        if not app.telemetry.metrics:
            lines.append("  router metrics off")
        streaming = _streaming(app)
        for node in app.ordered_nodes():
            lines.append(f"  node {node.id}: {kind_label(node.kind, node.id in streaming)}  [{_resources(node)}]")
            for child in node.edges:
                note = _edge_note(node, child, streaming)
                lines.append(f"    -> {child}" + (f"  ({note})" if note else ""))
    lines.append("worker groups")
    for plan in plan_worker_groups(graph):
        lines.append(
            f"  {plan.name}: {_shape(plan)} workers={plan.min_workers}..{plan.max_workers} (start {plan.initial_workers})"
            f"  hosts {', '.join(plan.nodes)}"
        )
        placed = _placement(plan.node_selector, plan.placement)
        if placed:
            lines.append(f"    placed: {placed}")
    return "\n".join(lines) + "\n"


def _shape(plan: WorkerGroupPlan) -> str:
    return f"cpu={plan.cpus:g} gpu={plan.gpus} mem={memory_text(plan.memory_bytes)}"


def summary(graph: model.Graph) -> dict[str, Any]:
    """What `describe` prints, as data (`servegraph inspect -o json|yaml`)."""
    apps = []
    for app in graph.applications:
        streaming = _streaming(app)
        nodes = []
        for node in app.ordered_nodes():
            lo, initial, hi = node.replica_range
            r = node.resources
            notes = _call_notes(node)
            nodes.append(
                {
                    "id": node.id,
                    "kind": kind_text(node.kind),
                    "streams": node.id in streaming,
                    "replicas": {"min": lo, "initial": initial, "max": hi, "autoscaling": node.autoscaling is not None},
                    "resources": {
                        "cpus": r.cpus,
                        "gpus": r.num_gpus,
                        "memory": memory_text(r.memory_bytes) if r.memory_bytes else None,
                        "acceleratorType": r.accelerator_type,
                        "custom": dict(r.custom),
                    },
                    "calls": [
                        {"node": child, "stream": child in streaming, "options": notes.get(child) or None}
                        for child in node.edges
                    ],
                }
            )
        apps.append({"name": app.name, "routePrefix": app.route_prefix, "ingress": app.ingress, "nodes": nodes})
    groups = [
        {
            "name": plan.name,
            "cpus": plan.cpus,
            "gpus": plan.gpus,
            "memory": memory_text(plan.memory_bytes),
            "workers": {"min": plan.min_workers, "initial": plan.initial_workers, "max": plan.max_workers},
            "hosts": list(plan.nodes),
            "placement": _placement(plan.node_selector, plan.placement) or None,
        }
        for plan in plan_worker_groups(graph)
    ]
    return {
        "name": graph.name,
        "version": graph.version,
        "schemaVersion": graph.schema_version,
        "applications": apps,
        "workerGroups": groups,
    }


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


def _style(kind: model.NodeKind) -> str:
    """Graphviz: one shape and colour per kind of node, so a picture reads without its legend."""
    match kind:
        case model.DeploymentKind():
            return 'shape=box, style="rounded,filled", fillcolor="#dbeafe"'
        case model.SequenceKind():
            return 'shape=cds, style=filled, fillcolor="#fef3c7"'
        case model.EnsembleKind():
            return 'shape=trapezium, style=filled, fillcolor="#dcfce7"'
        case model.SwitchKind():
            return 'shape=diamond, style=filled, fillcolor="#fce7f3"'
        case model.SplitterKind():
            return 'shape=invtriangle, style=filled, fillcolor="#ede9fe"'
        case _:
            assert_never(kind)


def _q(text: str) -> str:
    """A Graphviz quoted string (JSON's escaping is Graphviz's for quotes and backslashes)."""
    return json.dumps(text)


def to_dot(graph: model.Graph) -> str:
    """One cluster per application, nodes shaped by kind and labelled with their worker group
    and replicas, edges with their call options (dashed when optional, bold when they
    stream), and the worker groups in a box of their own."""
    plans = plan_worker_groups(graph)
    group_of = {host: plan.name for plan in plans for host in plan.nodes}
    lines = [f"digraph {_q(graph.name)} {{", "  rankdir=LR;", '  node [fontname="Helvetica", fontsize=11];']
    lines.append('  edge [fontname="Helvetica", fontsize=9];')
    lines.append(f"  label={_q(f'graph {graph.name} version {graph.version}')}; labelloc=t;")
    for i, app in enumerate(graph.applications):
        streaming = _streaming(app)
        lines.append(f"  subgraph cluster_{i} {{")
        lines.append(f"    label={_q(f'{app.name}  {app.route_prefix}')}; style=rounded;")
        for node in app.ordered_nodes():
            lo, _, hi = node.replica_range
            replicas = f"x{lo}" if lo == hi else f"x{lo}..{hi}"
            group = group_of.get(f"{app.name}/{node.id}", "")
            label = f"{node.id}\n{kind_label(node.kind, node.id in streaming)}\n{replicas} on {group}"
            style = _style(node.kind)
            peripheries = 2 if node.id == app.ingress else 1
            lines.append(f"    {_q(app.name + '/' + node.id)} [label={_q(label)}, {style}, peripheries={peripheries}];")
        for node in app.ordered_nodes():
            notes, labels = _call_notes(node), _edge_labels(node)
            for child in node.edges:
                attrs = []
                text = "\n".join(x for x in (labels.get(child), notes.get(child)) if x)
                if text:
                    attrs.append(f"label={_q(text)}")
                if "optional" in notes.get(child, ""):
                    attrs.append("style=dashed")
                if child in streaming:
                    attrs.append("penwidth=2")
                edge = f"{_q(app.name + '/' + node.id)} -> {_q(app.name + '/' + child)}"
                lines.append(f"    {edge}" + (f" [{', '.join(attrs)}]" if attrs else "") + ";")
        lines.append("  }")
    if plans:
        rows = "\n".join(
            f"{p.name}: {_shape(p)}, workers {p.min_workers}..{p.max_workers}, {_plural(len(p.nodes), 'node')}"
            for p in plans
        )
        legend = _q("worker groups\n" + rows)
        lines.append(f'  "worker groups" [shape=note, label={legend}];')
    lines.append("}")
    return "\n".join(lines) + "\n"
