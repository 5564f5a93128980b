"""kubernetes_asyncio clients for a ControlPlane identity (the operator's own client library).

Built from the server URL, CA file and token directly rather than from the kubeconfig,
so loading one writes no temp files.
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from servegraph_testbed.controlplane import ControlPlane
from servegraph_testbed.identities import ADMIN


def api_client(cp: ControlPlane, identity: str = ADMIN, *, token: str | None = None) -> Any:
    """An ApiClient as `identity` (or as the bearer `token`, e.g. a ServiceAccount's).

    The caller closes it: `await api.close()` (or `async with api_client(...) as api`).
    """
    configuration = client.Configuration(host=cp.server)
    configuration.ssl_ca_cert = str(cp.ca_file)
    configuration.api_key = {"BearerToken": token or cp.identity(identity).token}
    configuration.api_key_prefix = {"BearerToken": "Bearer"}
    return client.ApiClient(configuration)
