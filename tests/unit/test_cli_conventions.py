"""kubectl's, helm's and ray's habits (issue 47, item 5): `-o json|yaml`, `--version`, shell
completion, `-n`/`--context` everywhere with the context's namespace, `--dry-run`, `-` for
stdin, formats known by content, errors naming the file and capped, help with an example and
its defaults, "1 application", memory as 512Mi."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from builders import chain_app, graph
from cli_support import run_cli, servegraph_path, stand_in_api
from support import SAMPLES

from servegraph.cli.common import MAX_PROBLEMS_SHOWN
from servegraph.cli.completion import _subcommands
from servegraph.cli.main import _parser, main
from servegraph.graph import GraphError, load_graph
from servegraph.graph.validate import to_model
from servegraph.graph.workers import PodShape
from servegraph.render.inspect import describe

MINI = str(SAMPLES / "mini.txtpb")
COMMANDS = _subcommands(_parser())


@pytest.mark.parametrize("command", ["validate", "inspect", "render", "status"])
def test_o_json_and_yaml_where_kubectl_has_them(command: str) -> None:
    (action,) = [a for a in COMMANDS[command]._actions if "-o" in a.option_strings]
    assert action.option_strings == ["-o", "--output"] and {"json", "yaml"} <= set(action.choices or ())


def test_o_never_names_a_file() -> None:
    for name, parser in COMMANDS.items():
        for action in parser._actions:
            if "-o" in action.option_strings:
                assert action.choices, f"{name}: -o is a file"
    assert COMMANDS["pack"].parse_args(["g.txtpb", "--output", "g.pb"]).output == "g.pb"


def test_validate_inspect_render_print_json_and_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", MINI, "-o", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] and doc["graph"] == {"name": "mini", "version": "1", "applications": 1, "nodes": 2}
    assert main(["inspect", MINI, "-o", "yaml"]) == 0
    summary = yaml.safe_load(capsys.readouterr().out)
    assert [n["id"] for n in summary["applications"][0]["nodes"]] == ["tokenizer", "sentiment"]
    assert summary["workerGroups"][0]["memory"] == "16Gi"
    assert main(["render", MINI, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "RayService"


def test_invalid_as_json_is_still_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.txtpb"
    bad.write_text('name: "bad" schema_version: 1')
    assert main(["validate", str(bad), "-o", "json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc == {
        "file": str(bad),
        "valid": False,
        "problems": [{"path": "field applications", "message": "a graph needs at least one application"}],
    }


def test_version_and_completion(tmp_path: Path) -> None:
    assert run_cli("--version", home=tmp_path).stdout.startswith("servegraph 0.1.0")
    script = run_cli("completion", "bash", home=tmp_path).stdout
    probe = (
        f"{script}\n"
        "COMP_WORDS=(servegraph va); COMP_CWORD=1; _servegraph; echo ${COMPREPLY[@]}\n"
        'COMP_WORDS=(servegraph inspect g.pb -o ""); COMP_CWORD=4; _servegraph; echo ${COMPREPLY[@]}\n'
        "COMP_WORDS=(servegraph restart mini --dr); COMP_CWORD=3; _servegraph; echo ${COMPREPLY[@]}\n"
    )
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30, check=True)
    assert out.stdout.splitlines() == ["validate", "text json yaml dot svg", "--dry-run"]


CLUSTER = ["diff", "rollback", "restart", "status", "fetch"]


@pytest.mark.parametrize("command", CLUSTER)
def test_every_cluster_command_takes_context_and_kubeconfig(command: str) -> None:
    flags = {f for a in COMMANDS[command]._actions for f in a.option_strings}
    assert {"--context", "--kubeconfig"} <= flags
    if command != "fetch":
        assert {"-n", "--namespace"} <= flags
        (namespace,) = [a for a in COMMANDS[command]._actions if "--namespace" in a.option_strings]
        assert namespace.default is None, "the namespace defaults to the kubeconfig context's"


def _body(namespace: str) -> dict[str, object]:
    return {
        "metadata": {"name": "mini", "namespace": namespace, "uid": "u-1"},
        "spec": {"source": {"url": "https://r.example/g", "tokenSecretRef": {"name": "t"}}},
        "status": {
            "rollout": {"digest": "c" * 64},
            "history": [
                {"version": "2", "digest": "c" * 64, "outcome": "Serving", "readyAt": "t"},
                {"version": "1", "digest": "a" * 64, "outcome": "Superseded", "readyAt": "t"},
            ],
        },
    }


def test_rollback_and_restart_use_the_contexts_namespace_and_dry_run_sends_nothing(tmp_path: Path) -> None:
    with stand_in_api({servegraph_path("team-a", "mini"): _body("team-a")}) as api:
        kubeconfig = str(api.kubeconfig(tmp_path / "config", namespace="team-a"))
        for argv in (["rollback", "mini"], ["restart", "mini"]):
            out = run_cli(*argv, "--dry-run", "--kubeconfig", kubeconfig, home=tmp_path)
            assert out.returncode == 0, out.stderr
            assert out.stdout.startswith("dry run, nothing changed: ServeGraph team-a/mini would be ")
            assert "merge patch: {" in out.stdout
        assert [m for m, _, _ in api.requests] == ["GET", "GET"]
        out = run_cli("rollback", "mini", "--dry-run=server", "--kubeconfig", kubeconfig, home=tmp_path)
        assert out.returncode == 0 and "the API server accepted it" in out.stdout, out.stderr
        method, path, patch = api.requests[-1]
        assert (method, path) == ("PATCH", servegraph_path("team-a", "mini") + "?dryRun=All")
        assert patch == {"spec": {"rollout": {"pin": {"digest": "sha256:" + "a" * 64}}}}
        elsewhere = run_cli("restart", "mini", "--context", "other", "--kubeconfig", kubeconfig, home=tmp_path)
        assert elsewhere.stderr == "servegraph restart: ServeGraph default/mini not found\n"
        real = run_cli("restart", "mini", "--kubeconfig", kubeconfig, home=tmp_path)
        assert real.returncode == 0 and real.stdout.startswith("ServeGraph team-a/mini restarted ("), real.stderr
        assert api.requests[-1][0] == "PATCH" and "?" not in api.requests[-1][1]


def test_stdin_and_formats_by_content(tmp_path: Path) -> None:
    text = (SAMPLES / "mini.txtpb").read_text()
    out = run_cli("validate", "-", home=tmp_path, stdin=text)
    assert out.returncode == 0 and out.stdout.startswith("stdin: graph 'mini' version '1' is valid (1 application,")
    unnamed = tmp_path / "graph"
    unnamed.write_bytes((SAMPLES / "mini.pb").read_bytes())
    assert run_cli("inspect", str(unnamed), home=tmp_path).returncode == 0
    misnamed = tmp_path / "graph.pb"
    misnamed.write_text(text)
    wrong = run_cli("validate", str(misnamed), home=tmp_path)
    assert wrong.returncode == 2
    assert wrong.stderr == f"error: {misnamed}: the name says binary protobuf but the content is text: name it .txtpb\n"
    up = run_cli("up", "-", "--address", "http://127.0.0.1:1", home=tmp_path, stdin='name: "bad" schema_version: 1')
    assert (up.returncode, up.stderr) == (
        2,
        "error: stdin: field applications: a graph needs at least one application\n",
    )
    manifest = run_cli("validate", str(SAMPLES / "mini.yaml"), home=tmp_path)
    assert "this is a Kubernetes manifest (kind Secret), not a graph; a ServeGraph goes to --pods" in manifest.stderr
    assert "Wire format" not in manifest.stderr


def test_one_mistake_in_a_large_graph_is_a_capped_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    app = chain_app(length=500)
    for node in app.nodes.values():
        node.resources.num_cpus = -1
    path = tmp_path / "big.pb"
    path.write_bytes(graph(app).SerializeToString())
    assert main(["validate", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == MAX_PROBLEMS_SHOWN + 1
    assert all(line.startswith(f'error: {path}: application "app", node ') for line in lines[:-1])
    assert lines[-1] == f"error: {path}: ... and 480 more problems not shown"


def test_help_has_an_example_per_command_and_shows_defaults(tmp_path: Path) -> None:
    for name, parser in COMMANDS.items():
        text = parser.format_help()
        assert f"servegraph {name}" in text.split("example", 1)[-1], f"{name}: no example in its --help"
        for action in parser._actions:
            has_default = action.default not in (None, False, [], "", argparse.SUPPRESS) and action.option_strings
            if has_default and action.help and action.dest != "help":
                assert "default" in parser._get_formatter()._get_help_string(action), f"{name} {action.dest}"


def test_counts_are_english_and_memory_is_readable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", MINI]) == 0
    assert "(1 application, 2 nodes;" in capsys.readouterr().out
    assert describe(load_graph(MINI)).startswith("graph mini version '1' (schema 1): 1 application, 2 nodes\n")
    g = graph(chain_app(length=1))
    g.applications[0].nodes["n0"].resources.memory_bytes = 1024**3
    with pytest.raises(GraphError) as raised:
        from servegraph.graph.workers import plan_worker_groups

        plan_worker_groups(to_model(g), PodShape(memory_bytes=512 * 1024**2))
    assert "memory 1Gi > 512Mi (the worker pod set by the ServeGraph: memory 512Mi)" in str(raised.value)
    assert "e+0" not in str(raised.value)


def test_status_as_data_is_the_tree_as_json() -> None:
    """`status -o json|yaml`: the same sources as the tree (docs/observability.md's example)."""
    from test_front_door import _observed_snapshot

    from servegraph.statustree.document import document

    snapshot, _ = _observed_snapshot()
    doc = json.loads(json.dumps(document(snapshot)))
    assert (doc["name"], doc["namespace"], doc["ready"]["reason"]) == ("observed", "team-a", "AllApplicationsRunning")
    assert doc["rayService"] == {"name": "observed", "rayCluster": "observed-x7k2p"}
    review, strict = doc["applications"]
    assert (review["name"], review["status"], review["ingress"]) == ("review", "RUNNING", "pipeline")
    panel = next(n for n in review["nodes"] if n["id"] == "panel")
    assert panel == {
        "id": "panel",
        "kind": "ensemble",
        "streams": False,
        "state": "HEALTHY",
        "message": None,
        "replicas": {"running": 1, "target": 1},
        "calls": [
            {"node": "lexicon", "as": "member", "options": "timeout 5s, retries 1"},
            {"node": "second-opinion", "as": "member", "options": "timeout 0.5s, optional"},
        ],
    }
    assert [n["id"] for n in strict["nodes"]] == ["laggard", "quick", "quorum"]
