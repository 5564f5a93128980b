"""The Kubernetes client edge of the reconcile: RayServices, ServeGraph status, Secrets,
ConfigMaps and Events, as plain dicts, failures as `KubeError`.

Not the only code that talks to the API server: kopf runs the watches (and the
login), and `operator/run/leader.py` reads and writes its Lease itself. Everything
the reconcile and the events endpoint do goes through `KubeClient`.
"""

from servegraph.kube.client import KubeClient, KubeError, connect

__all__ = ["KubeClient", "KubeError", "connect"]
