"""The real KubeRay operator, run against a ControlPlane as a restricted identity.

By default it runs as the static user `kuberay-operator` bound to the ClusterRole that
KubeRay's own module ships (config/rbac/role.yaml), so a missing permission shows up
here as it would in a cluster, not hidden behind system:masters.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

import yaml

from servegraph_testbed.binaries import Binaries
from servegraph_testbed.controlplane import ControlPlane
from servegraph_testbed.identities import ADMIN
from servegraph_testbed.processes import Component, free_port, http_probe

RBAC_PATH = "/apis/rbac.authorization.k8s.io/v1"


class KubeRayOperator:
    """kuberay-operator (leader election off, all namespaces unless told) as a child process.

    `name` names its process and log file (`cp.component_log(name)`). `kuberay` picks the
    KubeRay: the control plane's (default), or a directory laid out alike, such as
    `cp.binaries.kuberay_previous` (its operator, crds/ and rbac/).
    """

    def __init__(
        self,
        control_plane: ControlPlane,
        *,
        identity: str = "kuberay-operator",
        name: str = "kuberay-operator",
        watch_namespaces: Sequence[str] = (),
        extra_args: Sequence[str] = (),
        ready_timeout: float = 60.0,
        kuberay: Binaries | None = None,
    ) -> None:
        self.control_plane = control_plane
        self.kuberay = kuberay or control_plane.binaries
        self.identity = identity
        self.name = name
        self.watch_namespaces = list(watch_namespaces)
        self.extra_args = list(extra_args)
        self.ready_timeout = ready_timeout
        self._component: Component | None = None

    def __enter__(self) -> KubeRayOperator:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> KubeRayOperator:
        """Install KubeRay's CRDs and RBAC, start the operator, wait for its /readyz."""
        cp = self.control_plane
        cp.install_crds(self.kuberay.kuberay_crds)
        if self.identity != ADMIN:
            self._grant_rbac()
        probe_port = free_port()
        argv = [
            str(self.kuberay.kuberay_operator),
            "--enable-leader-election=false",
            "--metrics-addr=0",  # controller-runtime: 0 turns the metrics server off
            f"--health-probe-bind-address=127.0.0.1:{probe_port}",
            "--log-stdout-encoder=console",
        ]
        if self.watch_namespaces:
            argv.append(f"--watch-namespace={','.join(self.watch_namespaces)}")
        component = cp.spawn(self.name, argv + self.extra_args, identity=self.identity)
        self._component = component
        try:
            component.wait_ready(lambda: http_probe(f"http://127.0.0.1:{probe_port}/readyz"), self.ready_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        component, self._component = self._component, None
        if component is not None:
            self.control_plane.unspawn(component)

    @property
    def pid(self) -> int | None:
        return self._component.pid if self._component is not None else None

    def log_tail(self, lines: int = 50) -> str:
        return self._component.log_tail(lines) if self._component is not None else ""

    def _grant_rbac(self) -> None:
        """Bind KubeRay's shipped ClusterRole to the identity's user."""
        cp = self.control_plane
        role_file = self.kuberay.kuberay_rbac
        if not role_file.is_file():
            raise FileNotFoundError(f"{role_file} missing: rerun hack/testenv/build.sh, or run KubeRay as {ADMIN!r}")
        role = yaml.safe_load(role_file.read_text())
        name = role["metadata"]["name"]
        rest = cp.rest()
        rest.apply(f"{RBAC_PATH}/clusterroles/{name}", role)
        rest.apply(
            f"{RBAC_PATH}/clusterrolebindings/{name}",
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": name,
                },
                "subjects": [
                    {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "User",
                        "name": cp.identity(self.identity).user,
                    }
                ],
            },
        )
