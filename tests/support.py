"""Paths and the real binaries' directory, shared by every test folder."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

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


REGISTRY_TOKEN = "s3cr3t-t0ken-value"
