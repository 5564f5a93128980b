"""`servegraph diff` on graph files, and how `servegraph rollback` picks a version."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from google.protobuf import text_format
from support import SAMPLES

from servegraph.cli.main import main
from servegraph.cli.rollouts import choose_version
from servegraph.v1 import graph_pb2


def write(tmp_path: Path, name: str, graph: graph_pb2.Graph) -> Path:
    path = tmp_path / f"{name}.pb"
    path.write_bytes(graph.SerializeToString())
    return path


def mini() -> graph_pb2.Graph:
    return text_format.Parse((SAMPLES / "mini.txtpb").read_text(), graph_pb2.Graph())


def test_diff_of_a_user_config_change_is_serve_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    old, new = mini(), mini()
    new.applications[0].nodes["sentiment"].user_config["threshold"] = 0.9
    assert main(["diff", str(write(tmp_path, "a", old)), str(write(tmp_path, "b", new)), "-o", "json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == "ServeConfigInPlace"
    assert out["extraAtPeak"]["pods"] == 0
    assert out["applications"] == [
        {"name": "sentiment", "change": "changed", "details": ["deployment sentiment: user_config"]}
    ]


def test_diff_of_a_new_hardware_class_says_new_cluster_and_its_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = mini(), mini()
    new.applications[0].nodes["tokenizer"].resources.custom["fast-disk"] = 1
    assert main(["diff", str(write(tmp_path, "a", old)), str(write(tmp_path, "b", new))]) == 1
    out = capsys.readouterr().out
    assert out.startswith("upgrade: NewCluster — starts a new Ray cluster")
    assert "extra at the peak: 2 pods" in out and "worker group cpu changed" in out


HISTORY = {
    "rollout": {"digest": "c" * 64},
    "history": [
        {"version": "3", "digest": "c" * 64, "outcome": "Serving", "readyAt": "t", "rollbackAvailable": True},
        {"version": "2", "digest": "b" * 64, "outcome": "RolledBack", "rollbackAvailable": True},
        {"version": "1", "digest": "a" * 64, "outcome": "Superseded", "readyAt": "t", "rollbackAvailable": True},
        {"version": "0", "digest": "d" * 64, "outcome": "Superseded", "readyAt": "t", "rollbackAvailable": False},
    ],
}


def test_rollback_defaults_to_the_last_ready_version_before_the_current_one() -> None:
    assert choose_version(HISTORY, None)["version"] == "1"


def test_rollback_to_a_version_or_a_digest_prefix() -> None:
    assert choose_version(HISTORY, "2")["digest"] == "b" * 64
    assert choose_version(HISTORY, "sha256:" + "a" * 12)["version"] == "1"


@pytest.mark.parametrize(
    ("wanted", "message"),
    [
        ("9", "no version or digest '9' in the history; it holds: 3 (cccccccccccc, Serving)"),
        ("0", "its graph was too large to keep"),
    ],
)
def test_rollback_says_what_the_history_holds(wanted: str, message: str) -> None:
    with pytest.raises(LookupError, match=message.replace("(", r"\(").replace(")", r"\)")):
        choose_version(HISTORY, wanted)
