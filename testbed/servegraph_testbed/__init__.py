"""A real Kubernetes control plane (etcd + kube-apiserver) and the real KubeRay operator.

For integration tests, bench/ and `make demo`; binaries come from hack/testenv/build.sh.

    with ControlPlane(crds=[Path("config/crd")], audit=True) as cp, KubeRayOperator(cp):
        kubeconfig = cp.kubeconfig("servegraph-operator")
"""

from servegraph_testbed.audit import WRITE_VERBS, AuditLog
from servegraph_testbed.binaries import Binaries, BinariesNotFound, find_binaries, find_manifests
from servegraph_testbed.controlplane import ControlPlane
from servegraph_testbed.identities import ADMIN, Identity, default_identities
from servegraph_testbed.kuberay import KubeRayOperator
from servegraph_testbed.processes import Component, ComponentError
from servegraph_testbed.rest import ApiError, Rest

__all__ = [
    "ADMIN",
    "WRITE_VERBS",
    "ApiError",
    "AuditLog",
    "Binaries",
    "BinariesNotFound",
    "Component",
    "ComponentError",
    "ControlPlane",
    "Identity",
    "KubeRayOperator",
    "Rest",
    "default_identities",
    "find_binaries",
    "find_manifests",
]
