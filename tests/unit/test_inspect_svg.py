"""A picture of the graph (issue 47, item 7): `servegraph inspect -o svg`, Graphviz's `dot` drawing
the digraph inspect emits — nodes shaped by kind, edges labelled with what they are and their
call options, the worker groups — and one clear line when `dot` is not installed.

`dot` is Debian's graphviz, installed by hack/testenv/build.sh as `make test` runs it."""

from __future__ import annotations

import html
import re
import shutil
from pathlib import Path

import pytest
from cli_support import one_line, run_cli
from support import SAMPLES

from servegraph.graph import load_graph
from servegraph.render.inspect import to_dot


@pytest.fixture(scope="module")
def dot() -> str:
    found = shutil.which("dot")
    if found is None:
        pytest.fail("Graphviz's dot is not installed: run hack/testenv/build.sh as root (or apt-get install graphviz)")
    return found


def test_inspect_draws_the_graph_as_svg(dot: str, tmp_path: Path) -> None:
    out = run_cli("inspect", str(SAMPLES / "complete.txtpb"), "-o", "svg", home=tmp_path)
    assert out.returncode == 0, out.stderr
    svg = out.stdout
    assert svg.startswith("<?xml") and "<svg" in svg and svg.rstrip().endswith("</svg>")
    titles = {html.unescape(t) for t in re.findall(r"<title>([^<]*)</title>", svg)}
    graph = load_graph(SAMPLES / "complete.txtpb")
    nodes = {f"{a.name}/{n}" for a in graph.applications for n in a.nodes}
    assert nodes <= titles, "every node is drawn"
    assert "search/canary->search/embedder-stable" in titles  # an edge, as Graphviz names it
    texts = {html.unescape(t) for t in re.findall(r">([^<>]+)</text>", svg)}
    assert {"90%", "= 'semantic'", "default", "combiner", "timeout 5s, optional"} <= texts
    assert "worker groups" in texts and any(t.startswith("a100: cpu=12 gpu=2") for t in texts)


def test_the_digraph_shapes_nodes_by_kind_and_labels_edges() -> None:
    text = to_dot(load_graph(SAMPLES / "complete.txtpb"))
    shapes = dict(re.findall(r'"(\w+/[\w-]+)" \[label="[^"]*", shape=(\w+)', text))
    assert shapes["search/router"] == shapes["search/by-body"] == "diamond"  # switches
    assert (shapes["search/canary"], shapes["reviews/vote"], shapes["reviews/pipeline"]) == (
        "invtriangle",
        "trapezium",
        "cds",
    )
    assert shapes["reviews/tokenizer"] == "box"
    assert '"reviews/vote" -> "reviews/sentiment-large" [label="timeout 5s, optional", style=dashed];' in text
    assert '"chat/reply" -> "chat/generator" [label="step 1\\ntimeout 30s", penwidth=2];' in text  # it streams


def test_without_dot_it_says_so_in_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    out = run_cli("inspect", str(SAMPLES / "mini.txtpb"), "-o", "svg", home=tmp_path, env={"PATH": str(empty)})
    assert out.returncode == 2 and out.stdout == ""
    assert one_line(out) == (
        "servegraph inspect: -o svg needs Graphviz's `dot`, which is not on PATH "
        "(apt-get install graphviz, brew install graphviz); -o dot prints what it would draw"
    )
