"""The bounded fuzz run of `make test` (about 40 s): replay the checked-in corpus, then mutate it.

The oracle and mutator are fuzz/fuzz_graph.py's, so what the long atheris run checks is
what this checks: parse_graph raises GraphError or nothing, and a graph that validates
renders and round-trips. Long runs: see fuzz/README.md.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from support import ROOT

HARNESS = ROOT / "fuzz" / "fuzz_graph.py"
SEED = int(os.environ.get("SERVEGRAPH_FUZZ_SEED", "20261122"))
"""Fixed so a failure reproduces; set SERVEGRAPH_FUZZ_SEED to explore other inputs."""
pytestmark = pytest.mark.timeout(45)  # a hang fails here, not at the suite's 600 s


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fuzz_graph", HARNESS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


fuzz = _load()


@pytest.mark.parametrize("target", sorted(fuzz.TARGETS))
def test_corpus_replays_without_crashing(target: str) -> None:
    files = sorted((fuzz.CORPUS / target).iterdir())
    assert len(files) >= 20, "the corpus is gone or was cut down to nothing"
    valid = 0
    for path in files:
        try:
            valid += fuzz.check(path.read_bytes(), fuzz.TARGETS[target])
        except Exception as exc:
            pytest.fail(f"{path.relative_to(ROOT)}: {type(exc).__name__}: {exc}", pytrace=False)
    # Both halves matter: valid graphs reach the renderers, invalid ones the error paths.
    assert 0 < valid < len(files)


@pytest.mark.parametrize("target", sorted(fuzz.TARGETS))
def test_mutated_corpus_raises_nothing_but_graph_error(target: str) -> None:
    try:
        stats = fuzz.fuzz_loop(fuzz.TARGETS[target], fuzz.corpus(target), iterations=4000, seconds=9, seed=SEED)
    except fuzz.Crash as crash:
        pytest.fail(f"seed {SEED}: {crash}\nadd it to tests/unit/test_fuzz_regressions.py once fixed", pytrace=False)
    assert stats.executions >= 100, f"only {stats.executions} inputs in {stats.seconds:.1f} s"
    assert stats.valid > 0, "no mutant validated: the renderers were not fuzzed"


def test_atheris_harness_runs(tmp_path: Path) -> None:
    """The long-run entry point still works: coverage-guided, on the JSON target for a few seconds."""
    pytest.importorskip("atheris")
    cmd = [sys.executable, str(HARNESS), "json", "-runs=100000", "-max_total_time=6", "-timeout=10"]
    cmd += [f"-seed={SEED}", f"-artifact_prefix={tmp_path}/", str(tmp_path), str(fuzz.CORPUS / "json")]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=40, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "Done" in run.stderr and " cov: " in run.stderr, run.stderr[-2000:]
    assert not list(tmp_path.glob("crash-*")) and not list(tmp_path.glob("timeout-*"))
