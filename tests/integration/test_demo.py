"""`make demo` as a newcomer runs it: everything starts, the cluster appears, all stops."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from support import ROOT


def test_demo_runs_end_to_end_and_cleans_up() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "servegraph.cli", "demo", "--duration", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert re.search(
        r"servegraph.servegraph.io/heterogeneous\s+False\s+2026.11.1\s+[0-9a-f]{12}\s+heterogeneous", text
    ), text
    assert re.search(r"raycluster.ray.io/heterogeneous-\w+", text), text
    assert "import_path: servegraph.runtime:build" in text
    match = re.search(r"^export KUBECONFIG=(\S+)$", text, re.M)
    assert match, text
    assert not Path(match.group(1)).exists(), "the demo's control plane directory was removed at exit"
    assert "Traceback" not in out.stderr
