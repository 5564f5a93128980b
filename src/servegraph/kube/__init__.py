"""The Kubernetes client edge: the only place servegraph talks to the API server."""

from servegraph.kube.client import FIELD_MANAGER, Kube, KubeError, connect

__all__ = ["FIELD_MANAGER", "Kube", "KubeError", "connect"]
