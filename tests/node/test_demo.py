"""`make demo-check` as a newcomer runs it: the whole story, answers right, nothing left.

Runs first in this tier (conftest.py orders every test that starts a node of its own
before those on the session's `stack`), before the session's own cluster exists: one node
at a time holds the machine's node lock, and the demo's cluster has the CPUs to itself.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from node_support import figure
from support import ROOT


def test_demo_check_serves_v1_then_v2_and_leaves_nothing_behind() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "servegraph_testbed.demo", "--check"],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-4000:]}\n{proc.stderr[-2000:]}"
    assert '->  {"label": "neutral", "score": 0.0}' in out, out
    assert '->  {"label": "positive", "score": 1.0}' in out, out
    # The same graph over gRPC through the serve Service, and the line a user runs for it.
    assert re.search(r'gRPC GraphService.Call \S+:9000 application sentiment .*->  \{.*"label": "positive"', out), out
    assert re.search(r"servegraph call --grpc \S+:9000 --app sentiment ", out), out
    first = re.search(r"apply -> first correct answer: ([\d.]+) s", out)
    update = re.search(r"publish -> new answer: ([\d.]+) s", out)
    assert first and update, out
    figure(f"demo: apply -> first answer {first.group(1)} s, publish -> new answer {update.group(1)} s")
    assert "nothing left behind" in out, out
