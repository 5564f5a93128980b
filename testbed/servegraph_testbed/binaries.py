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
REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "testenv" / "build.sh"
VERSIONS_FILE = REPO_ROOT / "hack" / "testenv" / "versions.env"
NAMES = ("kube-apiserver", "etcd", "kubectl", "kuberay-operator", "helm")
NODE_NAMES = ("kubelet", "kube-controller-manager", "kube-scheduler", "kube-proxy", "coredns", "pause", "traefik")


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
    def kubelet(self) -> Path:
        return self.root / "kubelet"

    @property
    def kube_controller_manager(self) -> Path:
        return self.root / "kube-controller-manager"

    @property
    def kube_scheduler(self) -> Path:
        return self.root / "kube-scheduler"

    @property
    def kube_proxy(self) -> Path:
        return self.root / "kube-proxy"

    @property
    def coredns(self) -> Path:
        return self.root / "coredns"

    @property
    def pause(self) -> Path:
        return self.root / "pause"

    @property
    def prometheus(self) -> Path:
        """Prometheus, for the observability tests (node tier: build.sh builds it with the node's binaries)."""
        return self.root / "prometheus"

    @property
    def traefik(self) -> Path:
        """Traefik, the node tier's Gateway API implementation (node/gateway.py)."""
        return self.root / "traefik"

    @property
    def pause_dockerfile(self) -> Path:
        """Kubernetes' own build/pause/Dockerfile, from the module the binaries come from."""
        return self.root / "pause.Dockerfile"

    @property
    def gateway_crds(self) -> Path:
        """The Gateway API's standard CRDs (KubeRay's incremental upgrade creates Gateways)."""
        return self.root / "gateway-crds"

    @property
    def kuberay_config(self) -> Path:
        """KubeRay's kustomize tree (its config/), as its users install it."""
        return self.root / "kuberay-config"

    @property
    def kuberay_previous(self) -> Binaries:
        """The previous KubeRay servegraph supports (KUBERAY_PREVIOUS_VERSION): a directory
        with its `kuberay-operator`, `crds/` and `rbac/`, laid out as this one."""
        return Binaries(self.root / "kuberay-previous")

    @property
    def versions(self) -> dict[str, str]:
        """hack/testenv/versions.env without the _VERSION suffix: {'KUBERAY': 'v1.7.0', ...}."""
        out = {}
        for line in VERSIONS_FILE.read_text().splitlines():
            name, sep, value = line.partition("=")
            if sep and not line.startswith("#") and name.endswith("_VERSION"):
                out[name.removesuffix("_VERSION")] = value.strip()
        return out

    def check_node(self) -> Binaries:
        """Also require the node tier's binaries (build.sh builds them unless told not to)."""
        missing = [n for n in NODE_NAMES if not os.access(self.root / n, os.X_OK)]
        if missing:
            raise BinariesNotFound(
                f"{self.root} lacks the node tier's {', '.join(missing)}; run hack/testenv/build.sh "
                f"(without SERVEGRAPH_TESTBED_TIER=controlplane) and set {ENV_VAR} to the directory it prints last"
            )
        return self

    @property
    def kuberay_rbac(self) -> Path:
        """KubeRay's generated ClusterRole (config/rbac/role.yaml of its module)."""
        return self.root / "rbac" / "kuberay-operator-role.yaml"

    def check_manifests(self) -> Binaries:
        """Require KubeRay's CRDs, the previous KubeRay's and the Gateway API's (no binary)."""
        needed = (self.kuberay_crds, self.kuberay_previous.kuberay_crds, self.gateway_crds)
        missing = [str(d.relative_to(self.root)) for d in needed if not any(d.glob("*.yaml"))]
        if missing:
            raise BinariesNotFound(
                f"{self.root} lacks {', '.join(missing)}; run hack/testenv/build.sh "
                f"(SERVEGRAPH_TESTBED_TIER=manifests for these alone) and set {ENV_VAR} to the directory it prints last"
            )
        return self

    def check(self) -> Binaries:
        missing = [n for n in NAMES if not os.access(self.root / n, os.X_OK)]
        if missing:
            raise BinariesNotFound(
                f"{self.root} lacks {', '.join(missing)}; run `make testenv` and set "
                f"{ENV_VAR} to the directory it prints last"
            )
        return self


def find_manifests() -> Binaries:
    """The manifests of $SERVEGRAPH_TESTENV (binaries or not), else of build.sh's manifests
    tier: KubeRay's and the Gateway API's CRDs come from module downloads, seconds where a
    cold build of the binaries takes minutes, so what checks renders against them need not wait."""
    if configured := os.environ.get(ENV_VAR):
        return Binaries(Path(configured)).check_manifests()
    return Binaries(_build(tier="manifests")).check_manifests()


def find_binaries() -> Binaries:
    """$SERVEGRAPH_TESTENV if set, else run build.sh (building on first use) for the directory."""
    if configured := os.environ.get(ENV_VAR):
        return Binaries(Path(configured)).check()
    return Binaries(_build()).check()


def _build(tier: str | None = None) -> Path:
    """The directory build.sh prints last (building what is missing)."""
    if not BUILD_SCRIPT.is_file():
        raise BinariesNotFound(f"{ENV_VAR} is not set and {BUILD_SCRIPT} does not exist")
    env = None if tier is None else {**os.environ, "SERVEGRAPH_TESTBED_TIER": tier}
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], stdout=subprocess.PIPE, text=True, check=False, env=env)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise BinariesNotFound(f"{BUILD_SCRIPT} failed with exit code {result.returncode}")
    return Path(lines[-1])
