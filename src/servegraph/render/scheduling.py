"""Where a Ray pod may run: the graph's worker-group hint, then the ServeGraph's overrides
for every worker group, then those for this group, as pod spec fields (pure).

Each layer refines the one before, field by field:

- `nodeSelector`: merged per label key, the later layer winning;
- `tolerations`: added up (a toleration only ever allows more nodes; duplicates dropped);
- `affinity`: per kind (`nodeAffinity`, `podAffinity`, `podAntiAffinity`), the later
  layer's replaces the earlier's (a term list cannot be merged meaningfully);
- `priorityClassName`: the last layer that sets one.

So the cluster's owner (the ServeGraph) can always re-aim what the graph's author asked,
and an empty override leaves the graph's placement alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from servegraph.dag import model


class Layer(Protocol):
    """The placement fields of a PodOverrides."""

    @property
    def node_selector(self) -> Mapping[str, str]: ...
    @property
    def tolerations(self) -> Sequence[Mapping[str, Any]]: ...
    @property
    def affinity(self) -> Mapping[str, Any] | None: ...
    @property
    def priority_class_name(self) -> str | None: ...


def pod_placement(
    node_selector: Mapping[str, str], hint: model.Placement | None, layers: Sequence[Layer | None]
) -> dict[str, Any]:
    """nodeSelector, affinity, tolerations and priorityClassName of a pod spec (only those set)."""
    hint = hint or model.Placement()
    selector = dict(node_selector)
    affinity = _affinity(hint)
    tolerations = [_toleration(t) for t in hint.tolerations]
    priority = hint.priority_class_name
    for layer in layers:
        if layer is None:
            continue
        selector.update(layer.node_selector)
        affinity.update(layer.affinity or {})
        tolerations.extend(dict(t) for t in layer.tolerations)
        priority = layer.priority_class_name or priority
    out: dict[str, Any] = {}
    if selector:
        out["nodeSelector"] = dict(sorted(selector.items()))
    if affinity:
        out["affinity"] = affinity
    unique = [t for i, t in enumerate(tolerations) if t not in tolerations[:i]]
    if unique:
        out["tolerations"] = unique
    if priority:
        out["priorityClassName"] = priority
    return out


def _toleration(t: model.Toleration) -> dict[str, Any]:
    out: dict[str, Any] = {"key": t.key} if t.key else {}
    out["operator"] = t.operator
    if t.value:
        out["value"] = t.value
    if t.effect:
        out["effect"] = t.effect
    if t.toleration_seconds is not None:
        out["tolerationSeconds"] = t.toleration_seconds
    return out


def _affinity(hint: model.Placement) -> dict[str, Any]:
    node: dict[str, Any] = {}
    if hint.required:
        terms = [{"matchExpressions": _requirements(term)} for term in hint.required]
        node["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": terms}
    if hint.preferred:
        node["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": p.weight, "preference": {"matchExpressions": _requirements(p.match)}} for p in hint.preferred
        ]
    return {"nodeAffinity": node} if node else {}


def _requirements(term: Sequence[model.NodeRequirement]) -> list[dict[str, Any]]:
    out = []
    for r in term:
        expression: dict[str, Any] = {"key": r.key, "operator": r.operator}
        if r.values:
            expression["values"] = list(r.values)
        out.append(expression)
    return out
