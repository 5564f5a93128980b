"""Graph parses shared across namespaces (issue 21, case 6): round robin by tenant, and one
tenant never holds every parse child. The scheduler alone, then the real children."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from google.protobuf import struct_pb2
from reconcile_support import NS, Cluster
from support import SAMPLES

from servegraph.dag.model import Graph
from servegraph.graph import GraphError
from servegraph.operator.fetch import parsing
from servegraph.operator.fetch.fairness import FairQueue
from servegraph.operator.fetch.parsing import GraphParser, default_workers
from servegraph.operator.run.worker import run_worker
from servegraph.v1 import graph_pb2
from servegraph_testbed.waiting import eventually

MINI = (SAMPLES / "mini.pb").read_bytes()


def beyond_inline(data: bytes = MINI) -> bytes:
    """`data` padded past what parses on the event loop (`parsing.INLINE_BYTES`): a quick
    parse, in a child."""
    msg = graph_pb2.Graph.FromString(data)
    node = next(n for app in msg.applications for n in app.nodes.values() if n.HasField("deployment"))
    node.user_config.update({"pad": "x" * parsing.INLINE_BYTES})
    return msg.SerializeToString()


QUICK = beyond_inline()


async def queued(parser: GraphParser, running_a: int, waiting: int) -> None:
    """Until tenant a's parses hold `running_a` children and `waiting` parses wait for one."""

    async def there() -> bool:
        return (parser.running("a"), parser.waiting()) == (running_a, waiting)

    await eventually(there, within=10, interval=0.005, what=f"{running_a} of a's parses running, {waiting} waiting")


def _drain(q: FairQueue[str]) -> list[str]:
    """Run everything one at a time: take, finish, repeat."""
    order = []
    while (ready := q.take()) is not None:
        tenant, item = ready
        order.append(item)
        q.finished(tenant)
    return order


def test_tenants_take_turns_whoever_queued_first() -> None:
    q: FairQueue[str] = FairQueue(1)
    for item in ("a1", "a2", "a3"):
        q.put("a", item)
    q.put("b", "b1")
    q.put("c", "c1")
    q.put("b", "b2")
    assert _drain(q) == ["a1", "b1", "c1", "a2", "b2", "a3"]
    assert q.tenants() == 0  # namespaces come and go: nothing is kept for one with nothing to do


def test_a_tenant_that_comes_back_goes_behind_those_waiting() -> None:
    q: FairQueue[str] = FairQueue(1)
    q.put("a", "a1")
    q.put("b", "b1")
    tenant, item = q.take() or ("", "")
    assert item == "a1"
    q.put("a", "a2")  # republished while its parse runs
    q.finished(tenant)
    assert _drain(q) == ["b1", "a2"]
    q.put("a", "a3")
    q.put("b", "b2")
    assert q.take() == ("a", "a3")  # came first, and neither has anything running: no memory of turns


def test_one_tenant_never_holds_every_worker() -> None:
    q: FairQueue[str] = FairQueue(3)
    for i in range(5):
        q.put("a", f"a{i}")
    assert [q.take(), q.take(), q.take()] == [("a", "a0"), ("a", "a1"), None]  # a third stays free
    q.put("b", "b0")
    assert q.take() == ("b", "b0")
    assert q.take() is None  # all three busy
    q.finished("a")
    assert q.take() == ("a", "a2")
    assert (q.running("a"), q.running("b"), q.waiting()) == (2, 1, 2)


def test_one_worker_is_shared_too() -> None:
    q: FairQueue[str] = FairQueue(1)
    q.put("a", "a0")
    assert q.take() == ("a", "a0")
    q.put("b", "b0")
    assert q.take() is None
    q.finished("a")
    assert q.take() == ("b", "b0")


def test_a_waiting_item_can_be_withdrawn() -> None:
    q: FairQueue[str] = FairQueue(1)
    q.put("a", "a0")
    q.put("b", "b0")
    assert q.discard("a", "a0") and not q.discard("a", "a0")
    assert _drain(q) == ["b0"]
    with pytest.raises(ValueError, match="1 or more"):
        FairQueue(0)


def test_the_default_is_the_cpu_budget_at_least_two_at_most_four() -> None:
    assert 2 <= default_workers() <= parsing.MAX_DEFAULT_WORKERS


def _slow() -> bytes:
    """199,000 null values and a bad route prefix: read whole, then refused (~0.5 s of parse CPU).
    The values are built as wire bytes: through the Python API it takes minutes."""
    null = b"\x12\x02\x08\x00"  # a Struct entry's value: Value{null_value: NULL_VALUE}
    keys = (f"{i:x}".encode() for i in range(199_000))
    raw = b"".join(b"\x0a" + bytes([len(k) + 2 + len(null), 0x0A, len(k)]) + k + null for k in keys)
    msg = graph_pb2.Graph.FromString(MINI)
    msg.applications[0].nodes["tokenizer"].user_config.MergeFrom(struct_pb2.Struct.FromString(raw))
    msg.applications[0].route_prefix = "no-leading-slash"
    return msg.SerializeToString()


async def _finish_order(workers: int) -> list[str]:
    """Tenant a queues three slow parses, then tenant b one quick one: the order they end in."""
    parser = GraphParser(workers=workers)
    await parser.start()
    slow, done = _slow(), []

    async def parse(tenant: str, name: str, data: bytes) -> None:
        with contextlib.suppress(GraphError):
            await parser.parse(data, len(data), tenant=tenant)
        done.append(name)

    try:
        tasks = [asyncio.create_task(parse("a", f"a{i}", slow)) for i in range(3)]
        await queued(parser, 1, 2)  # a's first parse runs (two children: a may hold one), the others wait
        tasks.append(asyncio.create_task(parse("b", "b", QUICK)))
        await asyncio.gather(*tasks)
    finally:
        await parser.close()
    return done


async def test_with_one_child_a_quick_parse_waits_for_one_slow_parse_not_all() -> None:
    """Before: one lock, first come first served: b ended after all of a's parses."""
    assert await _finish_order(1) == ["a0", "b", "a1", "a2"]


async def test_with_two_children_a_quick_parse_waits_for_none() -> None:
    assert (await _finish_order(2))[0] == "b"


async def test_a_cancelled_wait_frees_its_turn() -> None:
    parser = GraphParser(workers=1)
    slow = _slow()
    try:
        parsing.TENANT.set("a")
        first = asyncio.create_task(parser.parse(slow, len(slow)))
        await queued(parser, 1, 0)
        waiting = asyncio.create_task(parser.parse(QUICK, len(QUICK)))
        await queued(parser, 1, 1)
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        with contextlib.suppress(GraphError):
            await first
        assert (parser.running("a"), parser.waiting()) == (0, 0)
        graph = await parser.parse(QUICK, len(QUICK), tenant="b")  # the child is free again
        assert graph.name
    finally:
        await parser.close()


async def test_each_worker_parses_as_the_namespace_it_reconciles() -> None:
    c = Cluster()
    seen: list[str] = []
    parsed = asyncio.Event()

    async def parse(data: bytes, max_bytes: int) -> Graph:
        seen.append(parsing.TENANT.get())
        parsed.set()
        return await parsing.parse_here(data, max_bytes)

    c.reconciler.downloader.parser = parse
    c.watch_servegraph()
    worker = asyncio.create_task(run_worker(c.reconciler, c.queue))
    try:
        await asyncio.wait_for(parsed.wait(), timeout=5)
    finally:
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
    assert seen == [NS]
