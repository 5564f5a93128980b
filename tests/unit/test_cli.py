"""The CLI as users run it: a real subprocess, exit codes, stdout and stderr."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml
from support import SAMPLES

from servegraph.graph import load_graph
from servegraph.render import render_serve_config


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "servegraph.cli", *args], capture_output=True, text=True, timeout=60)


def test_validate_ok() -> None:
    out = run("validate", str(SAMPLES / "complete.txtpb"))
    assert out.returncode == 0, out.stderr
    assert "graph 'complete' version '7.2.0' is valid (3 applications, 14 nodes; 2,078 bytes, RayService " in out.stdout


def test_validate_reports_every_error_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.txtpb"
    bad.write_text(
        'name: "bad" schema_version: 1 applications { name: "a" route_prefix: "/a" ingress: "x"'
        ' nodes { key: "x" value { deployment { import_path: "m:X" args { node { id: "nope" } } } resources { num_cpus: -2 } } } }'
    )
    out = run("validate", str(bad))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert lines == [
        f'error: {bad}: application "a", node "x", field resources.num_cpus: must be a finite number ≥ 0, got -2.0',
        f'error: {bad}: application "a", node "x": unknown node reference "nope"',
    ]
    assert "Traceback" not in out.stderr


def test_missing_file_is_one_line() -> None:
    out = run("validate", "/nonexistent/graph.pb")
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == ["error: /nonexistent/graph.pb: No such file or directory"]


def test_render_serve_and_rayservice() -> None:
    out = run("render", str(SAMPLES / "mini.pb"), "--format", "serve")
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout) == render_serve_config(load_graph(SAMPLES / "mini.pb"))
    out = run("render", str(SAMPLES / "mini.pb"), "--name", "web", "--namespace", "prod", "--image", "img:1")
    assert out.returncode == 0, out.stderr
    manifest = yaml.safe_load(out.stdout)
    assert manifest["kind"] == "RayService"
    assert manifest["metadata"]["name"] == "web" and manifest["metadata"]["namespace"] == "prod"
    assert (
        manifest["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == "img:1"
    )


def test_inspect_and_dot() -> None:
    out = run("inspect", str(SAMPLES / "heterogeneous.pb"))
    assert out.returncode == 0, out.stderr
    assert "node embedder: servegraph.examples:Embedder" in out.stdout
    assert "    -> tokenizer" in out.stdout
    assert "gpu: cpu=8 gpu=1 mem=32Gi workers=1..4" in out.stdout
    dot = run("inspect", "--dot", str(SAMPLES / "heterogeneous.pb"))
    assert dot.stdout.startswith('digraph "heterogeneous" {')
    assert '"embed/embedder" -> "embed/tokenizer";' in dot.stdout


def test_validate_and_pack_refuse_a_graph_the_operator_could_not_size(tmp_path: Path) -> None:
    """A replica bigger than its hinted worker: the operator would report InvalidGraph, so the CLI does too."""
    text = (SAMPLES / "mini.txtpb").read_text() + '\ncluster { worker_groups { name: "tiny" cpus_per_worker: 0.1 } }\n'
    bad = tmp_path / "oversized.txtpb"
    bad.write_text(text)
    expected = (
        f'error: {bad}: application "sentiment", node "tokenizer", field resources: '
        'one replica does not fit a worker of group "tiny": num_cpus 0.25 > 0.1'
    )
    out = run("validate", str(bad))
    assert out.returncode == 2
    assert out.stderr.startswith(expected), out.stderr
    packed = run("pack", str(bad), "--output", str(tmp_path / "oversized.pb"))
    assert packed.returncode == 2 and expected in packed.stderr
    assert not (tmp_path / "oversized.pb").exists()


def test_pack_round_trips_and_refuses_invalid(tmp_path: Path) -> None:
    out_file = tmp_path / "mini.pb"
    out = run("pack", str(SAMPLES / "mini.txtpb"), "--output", str(out_file))
    assert out.returncode == 0, out.stderr
    assert out_file.read_bytes() == (SAMPLES / "mini.pb").read_bytes()
    as_json = tmp_path / "mini.json"
    assert run("pack", str(out_file), "--output", str(as_json), "--to", "json").returncode == 0
    assert load_graph(as_json) == load_graph(SAMPLES / "mini.pb")
    bad = tmp_path / "bad.txtpb"
    bad.write_text('name: "bad" schema_version: 1')
    refused = run("pack", str(bad), "--output", str(tmp_path / "bad.pb"))
    assert refused.returncode == 2
    assert "at least one application" in refused.stderr
    assert not (tmp_path / "bad.pb").exists()


def test_run_refuses_an_empty_source_host_allowlist_before_it_connects() -> None:
    """The README and docs/security.md say empty is refused, never read as "any" or "none"."""
    for empty in ("", " , "):
        out = run("run", "--allowed-source-hosts", empty, "--kubeconfig", "/nonexistent")
        assert out.returncode != 0
        assert "--allowed-source-hosts is empty" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
