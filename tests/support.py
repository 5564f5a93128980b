"""Paths and the real binaries' directory, shared by every test folder."""

from __future__ import annotations

from pathlib import Path

from servegraph_testbed import find_binaries

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "config" / "samples"


def testenv_dir() -> Path:
    """The directory of real control-plane binaries and KubeRay CRDs (see find_binaries)."""
    return find_binaries().root


REGISTRY_TOKEN = "s3cr3t-t0ken-value"
