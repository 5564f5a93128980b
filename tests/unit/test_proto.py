"""The generated Python code is what the .proto says: one source of truth."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from support import ROOT


def test_regenerating_changes_nothing() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "protogen.py"), "--check"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr


def test_check_detects_a_stale_file(tmp_path: Path) -> None:
    copy = tmp_path / "servegraph" / "v1"
    shutil.copytree(ROOT / "src" / "servegraph" / "v1", copy)
    (copy / "graph_pb2.pyi").write_text((copy / "graph_pb2.pyi").read_text() + "\n# edited by hand\n")
    out = subprocess.run(
        [sys.executable, str(ROOT / "hack" / "protogen.py"), "--check", "--src", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    assert "stale generated file: src/servegraph/v1/graph_pb2.pyi" in out.stderr
