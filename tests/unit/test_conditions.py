"""Condition types are one definition (names.ConditionType): the status the operator writes
and what `servegraph status` reads back follow it, in its order."""

from __future__ import annotations

from datetime import UTC, datetime

import yaml

from servegraph.names import ConditionType
from servegraph.operator import conditions
from servegraph.operator.conditions import Condition
from servegraph.statustree.tree import Snapshot, render

T0 = "2026-11-23T10:00:00Z"


def test_ours_come_in_the_enums_order_and_another_controllers_after_them() -> None:
    """Progressing once had no place in the order, so it sorted among foreign conditions by name."""
    current = [{"type": "Available", "status": "True", "reason": "ByHand", "message": "", "lastTransitionTime": T0}]
    updates = [Condition(t, True, "Why", "") for t in reversed(ConditionType)]
    merged = conditions.merge(current, updates, 1, T0)
    assert [c["type"] for c in merged] == [*ConditionType, "Available"]


def test_the_status_holds_plain_strings() -> None:
    """What the API server stores and what YAML and JSON dumpers take: not enum members."""
    merged = conditions.merge([], [Condition(ConditionType.READY, False, "NoValidGraph", "none yet")], 1, T0)
    assert type(merged[0]["type"]) is str
    assert yaml.safe_load(yaml.safe_dump(merged)) == merged


def test_servegraph_status_shows_every_condition_in_the_same_order() -> None:
    written = conditions.merge([], [Condition(t, True, f"{t}Reason", "") for t in ConditionType], 1, T0)
    servegraph = {"metadata": {"name": "g", "namespace": "ns"}, "status": {"conditions": list(reversed(written))}}
    text = render(Snapshot(servegraph), datetime(2026, 11, 23, 10, 5, tzinfo=UTC))
    shown = text.split("Conditions:\n")[1].splitlines()[1 : 1 + len(ConditionType)]
    assert [line.split()[0] for line in shown] == list(ConditionType)
    assert [line.split()[2] for line in shown] == [f"{t}Reason" for t in ConditionType]
