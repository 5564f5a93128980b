"""Shared pytest configuration: paths and the real binaries' directory."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "config" / "samples"


def testenv_dir() -> Path:
    """The directory of real control-plane binaries and KubeRay CRDs.

    `make test` passes it in SERVEGRAPH_TESTENV; otherwise build.sh finds or
    builds it (instant once cached).
    """
    env = os.environ.get("SERVEGRAPH_TESTENV")
    if env:
        return Path(env)
    out = subprocess.run(
        ["bash", str(ROOT / "hack" / "testenv" / "build.sh")], check=True, capture_output=True, text=True
    )
    path = Path(out.stdout.strip().splitlines()[-1])
    os.environ["SERVEGRAPH_TESTENV"] = str(path)
    return path


@pytest.fixture(scope="session")
def kuberay_crds() -> Path:
    return testenv_dir() / "crds"
