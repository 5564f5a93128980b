"""The parse child's life: its wire (`parse_child.serve`), its limits, and the operator's side
of a child that dies, at its CPU limit or killed, mid-parse or between parses."""

from __future__ import annotations

import asyncio
import io
import os
import pickle
import signal
from pathlib import Path

import pytest
from support import SAMPLES
from test_parse_fairness import QUICK, _slow

from servegraph.dag.model import Graph
from servegraph.graph import GraphError, parse_graph
from servegraph.operator.fetch import parse_child, parsing
from servegraph.operator.fetch.parsing import INLINE_BYTES, INLINE_NODES, GraphParser, ParserFailed
from servegraph.v1 import graph_pb2
from servegraph_testbed.waiting import eventually

MINI = (SAMPLES / "mini.pb").read_bytes()
NO_LIMIT = 1e9
"""CPU seconds for a parse run in the test's own process: `parse_limited` sets RLIMIT_CPU."""


def _answers(requests: list[tuple[bytes, int]]) -> list[tuple[str, object]]:
    wire = b"".join(parse_child.REQUEST.pack(len(d), m, NO_LIMIT) + d for d, m in requests)
    out = io.BytesIO()
    parse_child.serve(io.BytesIO(wire), out)
    raw, answers = out.getvalue(), []
    while raw:
        (size,) = parse_child.ANSWER.unpack_from(raw)
        answers.append(pickle.loads(raw[parse_child.ANSWER.size : parse_child.ANSWER.size + size]))
        raw = raw[parse_child.ANSWER.size + size :]
    return answers


def test_the_child_answers_each_request_in_order_until_its_input_ends() -> None:
    (ok, invalid, small) = _answers([(MINI, len(MINI)), (b"\xff\xff", 100), (MINI, 10)])
    assert ok[0] == "ok" and isinstance(ok[1], Graph) and ok[1].name
    assert invalid[0] == "invalid" and invalid[1]
    assert small[0] == "invalid" and any("10" in message for _, message in small[1])  # type: ignore[union-attr]


def test_a_request_cut_short_gets_no_answer() -> None:
    out = io.BytesIO()
    parse_child.serve(io.BytesIO(parse_child.REQUEST.pack(len(MINI), len(MINI), NO_LIMIT) + MINI[:10]), out)
    assert out.getvalue() == b""


def test_a_bug_in_the_parse_is_answered_by_its_type_only(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(data: bytes, max_bytes: int) -> Graph:
        raise KeyError("some internal detail")

    monkeypatch.setattr(parse_child, "parse_graph", broken)
    assert _answers([(MINI, len(MINI))]) == [("error", "KeyError")]


def _nice(pid: int) -> int:
    """The process's niceness, from the kernel (field 19 of /proc/PID/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2 :].split()[16])


def _oom_score_adj(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


def _bytes_read(pid: int) -> int:
    """What the process has read so far, from the kernel (`rchar` of /proc/PID/io)."""
    return int(Path(f"/proc/{pid}/io").read_text().split("rchar:")[1].split()[0])


async def _exited(parser: GraphParser) -> None:
    """Until the parser knows its one child has exited."""

    async def gone() -> bool:
        return parser.pids() == (None,)

    await eventually(gone, within=10, interval=0.01, what="the parser sees its child exited")


async def test_children_yield_the_cpu_and_are_the_first_oom_victims() -> None:
    """A parse takes what the operator's loop, the API server and smaller parses leave: on two
    shared cores, a child at the operator's priority made B's update 1.8x slower while A parsed."""
    parser = GraphParser(workers=1)
    try:
        await parser.start()
        (pid,) = parser.pids()
        assert pid is not None and pid != os.getpid()
        assert _nice(pid) == min(19, os.nice(0) + parsing.CHILD_NICENESS)
        assert _oom_score_adj(pid) == 1000
    finally:
        await parser.close()


async def test_a_child_killed_between_parses_is_replaced() -> None:
    parser = GraphParser(workers=1)
    try:
        await parser.start()
        (first,) = parser.pids()
        assert first is not None
        os.kill(first, signal.SIGKILL)
        await _exited(parser)
        graph = await parser.parse(QUICK, len(QUICK), tenant="a")
        assert graph.name and parser.pids()[0] not in (None, first)
    finally:
        await parser.close()


async def test_a_child_dying_mid_parse_is_an_invalid_graph_and_the_next_parse_gets_a_new_child() -> None:
    parser = GraphParser(workers=1)
    slow = _slow()
    try:
        await parser.start()
        (first,) = parser.pids()
        assert first is not None
        before = _bytes_read(first)
        parsing_now = asyncio.create_task(parser.parse(slow, len(slow), tenant="a"))

        async def has_the_graph() -> bool:  # read whole, so it parses now (~0.5 s)
            return _bytes_read(first) >= before + parse_child.REQUEST.size + len(slow)

        await eventually(has_the_graph, within=10, interval=0.005, what="the child read the graph")
        assert not parsing_now.done()
        os.kill(first, signal.SIGKILL)
        with pytest.raises(GraphError, match="could not be parsed within 10 s of CPU and 768 MiB of memory"):
            await parsing_now
        graph = await parser.parse(QUICK, len(QUICK), tenant="a")
        assert graph.name and parser.pids()[0] not in (None, first)
    finally:
        await parser.close()


async def test_a_parse_past_its_cpu_limit_is_stopped_by_the_kernel() -> None:
    """cpu_s=0: RLIMIT_CPU ends the child at its next whole CPU second, inside the C parser or not."""
    parser = GraphParser(cpu_s=0, workers=1)
    slow = _slow()
    try:
        await parser.start()
        (first,) = parser.pids()
        stopped = None
        for _ in range(6):  # each parse of `slow` is refused after ~0.5 s of CPU, if it lives that long
            try:
                await parser.parse(slow, len(slow), tenant="a")
            except GraphError as exc:
                if "could not be parsed within 0 s of CPU" in str(exc):
                    stopped = exc
                    break
                assert "route_prefix" in str(exc)
        assert stopped is not None, "the child was never stopped at its CPU limit"
        graph = await parser.parse(QUICK, len(QUICK), tenant="a")
        assert graph.name and parser.pids()[0] not in (None, first)
    finally:
        await parser.close()


class _Sink:
    """The child's stdin, for the test below: takes the request and keeps it."""

    def __init__(self) -> None:
        self.sent = b""

    def write(self, data: bytes) -> None:
        self.sent += data

    async def drain(self) -> None:
        return None


class _Answering:
    """A child process that has already written `answer`: the real `_Child.call` reads it."""

    def __init__(self, answer: tuple[str, object]) -> None:
        payload = pickle.dumps(answer)
        self.stdout = asyncio.StreamReader()
        self.stdout.feed_data(parse_child.ANSWER.pack(len(payload)) + payload)
        self.stdin = _Sink()
        self.returncode = None
        self.pid = 0


async def test_a_parser_bug_is_reported_as_one_not_as_a_bad_graph() -> None:
    """The child's ("error", type) answer: the reconcile's unexpected-error path, not GraphValid=False."""
    child = parsing._Child(parsing.MiB)
    process = _Answering(("error", "KeyError"))
    child._process = process  # type: ignore[assignment]
    with pytest.raises(ParserFailed, match="the graph parser failed with KeyError"):
        await child.call(MINI, len(MINI), 1.0)
    assert process.stdin.sent == parse_child.REQUEST.pack(len(MINI), len(MINI), 1.0) + MINI


async def test_close_waits_until_every_child_has_exited() -> None:
    """Reaped, pipes closed, before the loop may end: a child left to the garbage collector after
    its loop closed raised 'Event loop is closed' at exit."""
    parser = GraphParser(workers=2)
    await parser.start()
    pids = parser.pids()
    assert all(pids)
    await parser.close()
    for pid in pids:
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # gone and reaped: not even a zombie answers
    assert parser.pids() == (None, None)


def _problems(data: bytes, max_bytes: int) -> list[tuple[str, str]]:
    with pytest.raises(GraphError) as caught:
        parse_graph(data, max_bytes=max_bytes)
    return [(p.path, p.message) for p in caught.value.problems]


async def test_a_small_graph_is_parsed_on_the_loop_without_a_child() -> None:
    """The trip to a child cost more than parsing a typical tenant's graph (BENCHMARKS.md):
    small graphs, valid or not, get the child's answers without one."""
    parser = GraphParser(workers=1)  # not started: a child would be spawned by the first parse it got
    bad_route = graph_pb2.Graph.FromString(MINI)
    bad_route.applications[0].route_prefix = "no-leading-slash"
    invalid = bad_route.SerializeToString()
    try:
        assert await parser.parse(MINI, len(MINI)) == parse_graph(MINI)
        for data, max_bytes in ((invalid, len(invalid)), (b"\xff\xff", 100), (MINI, 10)):
            with pytest.raises(GraphError) as caught:
                await parser.parse(data, max_bytes)
            assert [(p.path, p.message) for p in caught.value.problems] == _problems(data, max_bytes)
        assert parser.pids() == (None,)
    finally:
        await parser.close()


def _minimal_nodes(count: int) -> bytes:
    msg = graph_pb2.Graph.FromString(MINI)
    app = msg.applications[0]
    for i in range(count - sum(len(a.nodes) for a in msg.applications)):
        app.nodes[f"x{i}"].deployment.import_path = "m:C"
    data = msg.SerializeToString()
    assert len(data) <= INLINE_BYTES
    return data


@pytest.mark.parametrize(("nodes", "in_child"), [(INLINE_NODES, False), (INLINE_NODES + 1, True)])
async def test_a_small_graph_of_many_nodes_goes_to_a_child(nodes: int, in_child: bool) -> None:
    """Few bytes can name many nodes, and validating nodes is what costs: past INLINE_NODES,
    a child parses it, within its CPU limit, off the loop."""
    data = _minimal_nodes(nodes)
    parser = GraphParser(workers=1)
    try:
        with pytest.raises(GraphError):  # its extra nodes are unreachable from the ingress
            await parser.parse(data, len(data))
        assert (parser.pids()[0] is not None) is in_child
    finally:
        await parser.close()


async def test_a_bug_in_a_parse_on_the_loop_is_reported_by_its_type_only(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object, **__: object) -> Graph:
        raise KeyError("some internal detail")

    monkeypatch.setattr(parsing, "to_model", broken)
    parser = GraphParser(workers=1)
    with pytest.raises(ParserFailed) as caught:
        await parser.parse(MINI, len(MINI))
    assert str(caught.value) == "the graph parser failed with KeyError"
    assert caught.value.__suppress_context__  # the detail stays out of the traceback too
