"""`servegraph diff` as a CI gate (issue 47, item 4): exit 1 on changes and 0 on none, as `diff`
and `kubectl diff` do; a new version alone is no change; `--pods` for two files; and the live
path reads a stored serveConfigV2 without PyYAML (`render/serve_text.py`) yet as PyYAML would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from bench_modules import load
from cli_support import run_cli, servegraph_path, stand_in_api
from google.protobuf import text_format
from support import SAMPLES

from servegraph.cli.main import main
from servegraph.graph import load_graph, parse_graph
from servegraph.render import RayServiceOptions, render_rayservice, render_serve_config, serve_config_yaml, serve_text
from servegraph.render.serve_text import _Reader, read_config
from servegraph.v1 import graph_pb2


def sample(name: str) -> graph_pb2.Graph:
    return text_format.Parse((SAMPLES / f"{name}.txtpb").read_text(), graph_pb2.Graph())


def write(tmp_path: Path, name: str, graph: graph_pb2.Graph | bytes) -> Path:
    path = tmp_path / f"{name}.pb"
    path.write_bytes(graph if isinstance(graph, bytes) else graph.SerializeToString())
    return path


def test_exit_codes_are_diffs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = write(tmp_path, "old", sample("observed"))
    assert main(["diff", str(old), str(old)]) == 0
    assert capsys.readouterr().out == "no change\n"
    changed = sample("observed")
    changed.applications[0].nodes["audit"].resources.num_cpus = 0.1
    assert main(["diff", str(old), str(write(tmp_path, "new", changed))]) == 1
    assert "deployment audit: ray_actor_options" in capsys.readouterr().out
    bad = tmp_path / "bad.txtpb"
    bad.write_text('name: "bad"')
    assert main(["diff", str(old), str(bad)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {bad}: ")  # the file with the problem is named


def test_a_version_only_bump_is_no_change(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The routers' user_config carries the version: every router's options differ, yet nothing a
    replica runs does (and the rendered config keeps carrying it)."""
    old, new = sample("observed"), sample("observed")
    new.version = "2"
    assert serve_config_yaml(load_graph(write(tmp_path, "a", old))) != serve_config_yaml(
        load_graph(write(tmp_path, "b", new))
    )
    assert main(["diff", str(tmp_path / "a.pb"), str(tmp_path / "b.pb")]) == 0
    assert capsys.readouterr().out == (
        "no change: graph version '1' -> '2' (the routers' user_config carries it: applied in place, "
        "no replica restarted)\n"
    )
    assert main(["diff", str(tmp_path / "a.pb"), str(tmp_path / "b.pb"), "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["changed"], doc["applications"], doc["version"]) == (False, [], {"old": "1", "new": "2"})
    plain, bumped = sample("mini"), sample("mini")  # no router: the version is rendered nowhere
    bumped.version = "2"
    assert main(["diff", str(write(tmp_path, "c", plain)), str(write(tmp_path, "d", bumped))]) == 0
    assert (
        capsys.readouterr().out
        == "no change: graph version '1' -> '2' (no router to carry it: nothing rendered changes)\n"
    )


def test_one_change_in_a_10000_node_version_bump_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: a real change buried in 1,005 lines of router user_config."""
    data = load("render_bench").make_graph(10_000)
    g = graph_pb2.Graph.FromString(data)
    g.version = "2"
    g.applications[3].nodes["n1"].user_config.update({"temperature": 0.9})
    assert main(["diff", str(write(tmp_path, "a", data)), str(write(tmp_path, "b", g)), "-o", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["applications"] == [{"name": "app3", "change": "changed", "details": ["deployment n1: user_config"]}]


def test_pods_apply_to_both_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old = write(tmp_path, "a", sample("mini"))
    bigger = sample("mini")
    bigger.applications[0].nodes["tokenizer"].resources.num_cpus = 3
    new = write(tmp_path, "b", bigger)
    pods = tmp_path / "sg.yaml"
    pods.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "servegraph.io/v1alpha1",
                "kind": "ServeGraph",
                "metadata": {"name": "mini"},
                "spec": {
                    "source": {"url": "https://r.example/g", "tokenSecretRef": {"name": "t"}},
                    "rayService": {"workers": {"resources": {"limits": {"cpu": "2", "memory": "4Gi"}}}},
                },
            }
        )
    )
    assert main(["diff", str(old), str(new)]) == 1  # the default 4-CPU worker holds 3 CPUs
    capsys.readouterr()
    assert main(["diff", str(old), str(new), "--pods", str(pods)]) == 2
    assert "num_cpus 3 > 2 (the worker pod set by the ServeGraph" in capsys.readouterr().err


def test_the_live_path_asks_in_the_contexts_namespace_and_reads_the_stored_config(tmp_path: Path) -> None:
    """diff sg/NAME against a stand-in API server: the ServeGraph and its RayService are read in the
    kubeconfig context's namespace, and an unchanged graph is no change (exit 0)."""
    graph = load_graph(SAMPLES / "observed.pb")
    options = RayServiceOptions(name="observed", namespace="team-a")
    live = render_rayservice(graph, options)
    sg = {
        "apiVersion": "servegraph.io/v1alpha1",
        "kind": "ServeGraph",
        "metadata": {"name": "observed", "namespace": "team-a", "uid": "u-1"},
        "spec": {"source": {"url": "https://r.example/g", "tokenSecretRef": {"name": "t"}}},
        "status": {"rayServiceName": "observed"},
    }
    rs_path = "/apis/ray.io/v1/namespaces/team-a/rayservices/observed"
    with stand_in_api({servegraph_path("team-a", "observed"): sg, rs_path: live}) as api:
        kubeconfig = str(api.kubeconfig(tmp_path / "config", namespace="team-a"))
        same = run_cli("diff", "sg/observed", str(SAMPLES / "observed.pb"), "--kubeconfig", kubeconfig, home=tmp_path)
        assert (same.returncode, same.stdout) == (0, "no change\n"), same.stderr
        bumped = sample("observed")
        bumped.version = "9"
        out = run_cli(
            "diff", "sg/observed", str(write(tmp_path, "v9", bumped)), "--kubeconfig", kubeconfig, home=tmp_path
        )
        assert out.returncode == 0 and out.stdout.startswith("no change: graph version '1' -> '9'"), out
        gone = run_cli("diff", "sg/nope", str(SAMPLES / "mini.pb"), "--kubeconfig", kubeconfig, home=tmp_path)
        assert (gone.returncode, gone.stderr) == (2, "servegraph diff: ServeGraph team-a/nope not found\n")
    paths = [p for m, p, _ in api.requests if m == "GET"]
    assert paths[:2] == [servegraph_path("team-a", "observed"), rs_path]


# ---- reading a stored serveConfigV2 back ------------------------------------------------


@pytest.mark.parametrize("name", ["mini", "heterogeneous", "complete", "observed", "streaming"])
def test_the_reader_reads_what_the_renderer_wrote_as_yaml_does(name: str) -> None:
    graph = load_graph(SAMPLES / f"{name}.pb")
    text = serve_config_yaml(graph)
    fast = _Reader(text.split("\n")).document()  # the fast path itself, no fallback
    assert fast == yaml.safe_load(text) == render_serve_config(graph)


@pytest.mark.parametrize(
    "text",
    [
        "a: 1\nb:\n- x\n- y\n",  # a list at its key's indent (valid YAML the renderer never writes)
        "a: |\n  two\n  lines\n",
        "a: 1e+16\n",  # YAML 1.1 reads this as a string
        'a: {? "k": 1}\n',
        "# a comment\na: yes\n",
        "a: 0777\n",
    ],
)
def test_anything_else_is_read_by_yaml(text: str) -> None:
    assert read_config(text) == yaml.safe_load(text)


def test_10000_nodes_are_read_back_by_the_fast_reader_never_by_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    """The live path read the stored config with libyaml: 2.8-3.1 s at 10,000 nodes. The fast
    reader takes 0.10-0.15 s (`bench/diff_bench.py`, BENCHMARKS.md); what a test can hold
    without timing is that a rendered graph of that size never falls back to YAML."""
    graph = parse_graph(load("render_bench").make_graph(10_000))
    text = serve_config_yaml(graph)

    def no_yaml(*args: object, **kwargs: object) -> None:
        raise AssertionError("read_config fell back to YAML")

    monkeypatch.setattr(serve_text.yaml, "load", no_yaml)
    assert read_config(text) == render_serve_config(graph)
