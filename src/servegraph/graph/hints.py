"""A worker-group hint's placement (node selector, tolerations, node affinity, priority
class), checked as Kubernetes would check the pods, into the model.

Checked here rather than left to Kubernetes because a bad value would be refused only
when KubeRay creates the pods, long after the publish, where the registry author never
looks; here it is one more problem `servegraph validate` names with the rest.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

from servegraph.dag import model
from servegraph.graph.errors import Problem
from servegraph.v1 import graph_pb2

MAX_ITEMS = 64
"""Tolerations, terms, requirements per term and values per requirement of one group."""

_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_INTEGER = re.compile(r"^[+-]?[0-9]{1,18}$")
TOLERATION_OPERATORS = ("Equal", "Exists")
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
NODE_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")

Add = Callable[[Problem], None]


def is_label_key(key: str) -> bool:
    """A Kubernetes label key: an optional DNS-subdomain prefix and '/', then a name."""
    prefix, _, name = key.rpartition("/")
    return bool(_NAME.fullmatch(name)) and (not prefix or bool(_SUBDOMAIN.fullmatch(prefix)))


def node_selector(selector: Mapping[str, str], loc: str, add: Add) -> None:
    for key, value in sorted(selector.items()):
        if not is_label_key(key):
            add(Problem(loc, f"node_selector key {key!r} is not a valid Kubernetes label key"))
        if not _VALUE.fullmatch(value):
            add(Problem(loc, f"node_selector[{key!r}] {value!r} is not a valid Kubernetes label value"))


def to_placement(msg: graph_pb2.WorkerGroupHint, loc: str, add: Add) -> model.Placement:
    """The hint's tolerations, node affinity and priority class; every problem goes to `add`."""
    priority = msg.priority_class_name
    if priority and (len(priority) > 253 or not _SUBDOMAIN.fullmatch(priority)):
        add(Problem(loc, f"priority_class_name {priority!r} is not a DNS-1123 subdomain"))
    affinity = msg.node_affinity
    if _too_many(loc, add, tolerations=msg.tolerations, required=affinity.required, preferred=affinity.preferred):
        return model.Placement()
    tolerations = tuple(_toleration(t, f"{loc} tolerations[{i}]", add) for i, t in enumerate(msg.tolerations))
    required = tuple(_term(term, f"{loc} node_affinity.required[{i}]", add) for i, term in enumerate(affinity.required))
    preferred = []
    for i, p in enumerate(affinity.preferred):
        at = f"{loc} node_affinity.preferred[{i}]"
        if not 1 <= p.weight <= 100:
            add(Problem(at, f"weight {p.weight} must be 1 to 100"))
        preferred.append(model.PreferredNodes(p.weight, _term(p.term, f"{at}.term", add)))
    return model.Placement(
        tolerations=tolerations, required=required, preferred=tuple(preferred), priority_class_name=priority or None
    )


def _too_many(loc: str, add: Add, **lists: Sequence[object]) -> bool:
    over = [name for name, items in lists.items() if len(items) > MAX_ITEMS]
    for name in over:
        add(Problem(loc, f"{name} has over {MAX_ITEMS} entries"))
    return bool(over)


def _toleration(t: graph_pb2.Toleration, loc: str, add: Add) -> model.Toleration:
    operator = t.operator or "Equal"
    if operator not in TOLERATION_OPERATORS:
        add(Problem(loc, f"operator {t.operator!r} must be Equal or Exists"))
    if t.key and not is_label_key(t.key):
        add(Problem(loc, f"key {t.key!r} is not a valid Kubernetes label key"))
    if not t.key and operator != "Exists":
        add(Problem(loc, 'an empty key (every taint) needs operator "Exists"'))
    if operator == "Exists" and t.value:
        add(Problem(loc, 'value must be empty with operator "Exists"'))
    elif not _VALUE.fullmatch(t.value):
        add(Problem(loc, f"value {t.value!r} is not a valid Kubernetes label value"))
    if t.effect and t.effect not in EFFECTS:
        add(Problem(loc, f"effect {t.effect!r} must be one of {', '.join(EFFECTS)} or empty"))
    seconds = t.toleration_seconds if t.HasField("toleration_seconds") else None
    if seconds is not None and t.effect != "NoExecute":
        add(Problem(loc, 'toleration_seconds is only meaningful with effect "NoExecute"'))
    return model.Toleration(t.key, operator, t.value, t.effect, seconds)


def _term(term: graph_pb2.NodeSelectorTerm, loc: str, add: Add) -> tuple[model.NodeRequirement, ...]:
    if not term.match_expressions:
        add(Problem(loc, "a node selector term needs at least one requirement in match_expressions"))
    if _too_many(loc, add, match_expressions=term.match_expressions):
        return ()
    out = []
    for i, r in enumerate(term.match_expressions):
        at = f"{loc}.match_expressions[{i}]"
        if not is_label_key(r.key):
            add(Problem(at, f"key {r.key!r} is not a valid Kubernetes label key"))
        values = tuple(r.values)
        if r.operator not in NODE_OPERATORS:
            add(Problem(at, f"operator {r.operator!r} must be one of {', '.join(NODE_OPERATORS)}"))
        elif r.operator in ("In", "NotIn") and not 1 <= len(values) <= MAX_ITEMS:
            add(Problem(at, f"operator {r.operator} needs 1 to {MAX_ITEMS} values"))
        elif r.operator in ("Exists", "DoesNotExist") and values:
            add(Problem(at, f"operator {r.operator} takes no values"))
        elif r.operator in ("Gt", "Lt") and (len(values) != 1 or not _INTEGER.fullmatch(values[0])):
            add(Problem(at, f"operator {r.operator} needs exactly one integer value"))
        bad = [v for v in values[:MAX_ITEMS] if not _VALUE.fullmatch(v)]
        if bad and r.operator in ("In", "NotIn"):
            add(Problem(at, f"{bad[0]!r} is not a valid Kubernetes label value"))
        out.append(model.NodeRequirement(r.key, r.operator, values))
    return tuple(out)
