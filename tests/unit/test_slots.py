"""Download slots per namespace: a freed slot wakes one parked ServeGraph, the oldest, and a
turn it does not use goes on, so nobody stays parked while a slot is free."""

from __future__ import annotations

from servegraph.names import Key
from servegraph.operator.fetch.slots import NamespaceSlots


def keys(*names: str) -> list[Key]:
    return [("ns", n) for n in names]


def test_a_freed_slot_wakes_the_oldest_parked_only() -> None:
    woken: list[Key] = []
    slots = NamespaceSlots(2, woken.append)
    a, b, c, d, e = keys("a", "b", "c", "d", "e")
    assert slots.acquire(a) and slots.acquire(b)
    assert not slots.acquire(c) and not slots.acquire(d) and not slots.acquire(e)
    assert slots.acquire(("other", "x")), "another namespace has its own slots"
    slots.release(a)
    assert woken == [c], "one woken per freed slot, the oldest"
    assert slots.acquire(c) and slots.parked("ns") == 2
    slots.done(c)
    assert woken == [c], "it used its turn: nothing more to wake"
    slots.release(b)
    slots.release(c)
    assert woken == [c, d, e]


def test_a_turn_not_used_goes_to_the_next_and_one_lost_to_another_keeps_its_place() -> None:
    woken: list[Key] = []
    slots = NamespaceSlots(1, woken.append)
    a, b, c, d, late = keys("a", "b", "c", "d", "late")
    assert slots.acquire(a)
    for k in (b, c, d):
        assert not slots.acquire(k)
    slots.release(a)
    assert woken == [b]
    slots.done(b)  # its reconcile needed no download after all
    assert woken == [b, c], "the turn went on"
    slots.forget(c)  # deleted before its reconcile ran
    assert woken == [b, c, d]
    assert slots.acquire(late), "a slot free is anyone's"
    assert not slots.acquire(d), "woken, but the slot was taken first"
    slots.done(d)
    assert woken == [b, c, d], "nothing free: the taker's release wakes the next"
    slots.release(late)
    assert woken == [b, c, d, d], "it kept its place at the front"
    assert slots.acquire(d)
    slots.done(d)
    slots.release(d)
    assert len(slots) == 0, "nothing kept once every slot is free and nobody parked"
