"""Where the control-plane binaries are: $SERVEGRAPH_TESTENV, else what build.sh prints.

build.sh owns building, caching and KUBEBUILDER_ASSETS; this module only asks it for
the directory (its last line of output), so there is one place that knows versions.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "SERVEGRAPH_TESTENV"
REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO_ROOT / "hack" / "testenv" / "build.sh"
NAMES = ("kube-apiserver", "etcd", "kubectl", "kuberay-operator", "helm")


class BinariesNotFound(RuntimeError):
    """The testenv directory is missing or incomplete."""


@dataclass(frozen=True)
class Binaries:
    """The directory build.sh prints: the five binaries plus crds/ (and rbac/) from KubeRay."""

    root: Path

    @property
    def kube_apiserver(self) -> Path:
        return self.root / "kube-apiserver"

    @property
    def etcd(self) -> Path:
        return self.root / "etcd"

    @property
    def kubectl(self) -> Path:
        return self.root / "kubectl"

    @property
    def kuberay_operator(self) -> Path:
        return self.root / "kuberay-operator"

    @property
    def helm(self) -> Path:
        return self.root / "helm"

    @property
    def kuberay_crds(self) -> Path:
        return self.root / "crds"

    @property
    def kuberay_rbac(self) -> Path:
        """KubeRay's generated ClusterRole (config/rbac/role.yaml of its module)."""
        return self.root / "rbac" / "kuberay-operator-role.yaml"

    def check(self) -> Binaries:
        missing = [n for n in NAMES if not os.access(self.root / n, os.X_OK)]
        if missing:
            raise BinariesNotFound(
                f"{self.root} lacks {', '.join(missing)}; run `make testenv` and set "
                f"{ENV_VAR} to the directory it prints last"
            )
        return self


def find_binaries() -> Binaries:
    """$SERVEGRAPH_TESTENV if set, else run build.sh (building on first use) for the directory."""
    if configured := os.environ.get(ENV_VAR):
        return Binaries(Path(configured)).check()
    if not BUILD_SCRIPT.is_file():
        raise BinariesNotFound(f"{ENV_VAR} is not set and {BUILD_SCRIPT} does not exist")
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise BinariesNotFound(f"{BUILD_SCRIPT} failed with exit code {result.returncode}")
    return Binaries(Path(lines[-1])).check()
