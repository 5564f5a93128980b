"""`validate` accepts exactly what the operator applies (issue 47, item 3): one set of limits
(`graph/limits.py`), read by both; each refusal names the numbers. Before, validate passed a
graph rendered past KubeRay's int32, a memory of 2^63, a RayService of 2.9 MB the operator
refuses (RenderTooLarge) and a graph over the operator's 4 MiB download cap."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from bench_modules import load
from google.protobuf import text_format
from support import SAMPLES

from servegraph import graph as graph_package
from servegraph.cli import operate
from servegraph.cli.main import _parser, main
from servegraph.graph import GraphError, limits, parse_graph
from servegraph.operator.apply import objectsize
from servegraph.operator.apply.rendering import _sized
from servegraph.operator.spec import owner_reference, parse_spec
from servegraph.v1 import graph_pb2


def mini() -> graph_pb2.Graph:
    return text_format.Parse((SAMPLES / "mini.txtpb").read_text(), graph_pb2.Graph())


def write(tmp_path: Path, graph: graph_pb2.Graph | bytes, name: str = "g.pb") -> Path:
    path = tmp_path / name
    path.write_bytes(graph if isinstance(graph, bytes) else graph.SerializeToString())
    return path


def refused_by_both(tmp_path: Path, graph: graph_pb2.Graph, capsys: pytest.CaptureFixture[str]) -> str:
    """The CLI's one line, after checking that the operator's parse refuses the same graph."""
    data = graph.SerializeToString()
    with pytest.raises(GraphError) as operator:
        parse_graph(data, max_bytes=len(data))  # what the operator's parse (child or loop) runs
    path = write(tmp_path, graph)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == "".join(f"error: {path}: {p}\n" for p in operator.value.problems)
    return err


def test_replicas_past_kuberays_int32_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = mini()
    g.applications[0].nodes["tokenizer"].scaling.num_replicas = 4294967295
    err = refused_by_both(tmp_path, g, capsys)
    assert (
        "field scaling.num_replicas: 4294967295 is over the limit of 2147483647 (KubeRay's replica counts are int32)"
        in err
    )
    auto = mini()
    scaling = auto.applications[0].nodes["tokenizer"].scaling
    scaling.ClearField("num_replicas")
    scaling.autoscaling.min_replicas, scaling.autoscaling.max_replicas = 1, 2**31
    assert "field scaling.autoscaling.max_replicas: 2147483648 is over the limit" in refused_by_both(
        tmp_path, auto, capsys
    )


def test_workers_past_int32_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two nodes at the most replicas each, a CPU a replica, a CPU a worker: 2^32 - 2 workers."""
    g = mini()
    g.cluster.worker_groups.add(name="cpu", cpus_per_worker=1)
    for node in g.applications[0].nodes.values():
        node.scaling.num_replicas = limits.MAX_INT32
        node.resources.num_cpus = 1
    err = refused_by_both(tmp_path, g, capsys)
    assert 'worker group "cpu": its replicas need 4,294,967,294 workers, over KubeRay\'s 2,147,483,647' in err


def test_a_memory_of_2_to_the_63_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = mini()
    g.applications[0].nodes["sentiment"].resources.memory_bytes = 2**63
    err = refused_by_both(tmp_path, g, capsys)
    assert "field resources.memory_bytes: 9223372036854775808 is over the limit of 4611686018427387904 (4Ei)" in err


def test_a_rayservice_too_large_to_store_is_refused_with_its_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = load("render_bench").make_graph(10_000)
    path = write(tmp_path, data)
    options = parse_spec({"source": {"url": "https://r.example/g", "tokenSecretRef": {"name": "t"}}}, "default")
    body = {"metadata": {"name": "bench", "uid": "00000000-0000-0000-0000-000000000000"}}
    _, size = _sized(parse_graph(data), options.rayservice_options("bench", "default", owner_reference(body)))
    assert main(["validate", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"error: {path}: the rendered RayService bench is {size:,} bytes of JSON, over the 1,468,006 bytes the API "
        "server can store (etcd's 1.5 MiB request limit, less room for status): the operator refuses it "
        "(RenderTooLarge)\n"
    )
    assert objectsize.too_large("bench", size) is not None  # the operator's own check on the same size


def test_the_size_validate_reports_is_the_operators(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """For a ServeGraph given with --pods, validate renders what the operator renders: the same bytes."""
    data = load("render_bench").make_graph(2_000)
    sg = yaml.safe_load_all((SAMPLES / "complete.yaml").read_text())
    (doc,) = [d for d in sg if d["kind"] == "ServeGraph"]
    body = {"metadata": {"name": "complete", "uid": "00000000-0000-0000-0000-000000000000"}}
    spec = parse_spec(doc["spec"], "default")
    _, size = _sized(parse_graph(data), spec.rayservice_options("complete", "default", owner_reference(body)))
    assert main(["validate", str(write(tmp_path, data)), "--pods", str(SAMPLES / "complete.yaml"), "-o", "json"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["rayServiceBytes"] == size


def test_a_graph_over_the_operators_download_cap_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    g = mini()
    for i in range(80):
        g.applications[0].nodes["sentiment"].user_config[f"k{i}"] = "x" * 60_000
    path = write(tmp_path, g)
    size = path.stat().st_size
    assert size > 4 * 1024 * 1024
    assert main(["validate", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"error: {path}: the graph is {size:,} bytes as binary protobuf, over the 4,194,304 bytes the operator "
        "downloads (its --max-graph-bytes; the download fails with TooLarge)\n"
    )
    # An operator allowed larger downloads would get it, and refuse what it renders: every byte of a
    # graph is in its Serve config, so a graph this large is also a RayService too large to store.
    assert main(["validate", str(path), "--max-graph-bytes", str(8 * 1024 * 1024)]) == 2
    err = capsys.readouterr().err
    assert "bytes as binary protobuf" not in err and "the operator refuses it (RenderTooLarge)" in err


def test_one_set_of_limits() -> None:
    """The operator's checks and the command line's read the same numbers."""
    assert objectsize.MAX_RAYSERVICE_BYTES is limits.MAX_RAYSERVICE_BYTES
    assert objectsize.manifest_bytes is limits.manifest_bytes
    assert graph_package.MAX_NODES is limits.MAX_NODES
    run = _parser().parse_args(["run"])
    validate = _parser().parse_args(["validate", "g.pb"])
    assert run.max_graph_bytes == validate.max_graph_bytes == limits.MAX_GRAPH_BYTES == 4 * 1024 * 1024
    assert operate.MAX_GRAPH_BYTES is limits.MAX_GRAPH_BYTES
