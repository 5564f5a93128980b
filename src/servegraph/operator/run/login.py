"""kopf's credentials at a kubeconfig context other than the current one (`servegraph run
--context`), the way every other command of ours reads a kubeconfig.

kopf's own kubeconfig login reads only the current-context, and only static credentials;
kubernetes_asyncio's loader, the one the operator's own API client uses, also runs exec
plugins and writes inline certificates to private temporary files. Both clients then talk
to the same cluster as the same user.
"""

from __future__ import annotations

import os
from pathlib import Path

import kopf
from kubernetes_asyncio import client, config


async def at_context(kubeconfig: str | None, context: str) -> kopf.ConnectionInfo:
    """The ConnectionInfo of `context` in `kubeconfig` (else $KUBECONFIG, else ~/.kube/config)."""
    path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    cfg = client.Configuration()
    try:
        await config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
    except (config.ConfigException, OSError) as exc:
        raise kopf.LoginError(f"kubeconfig {path}, context {context!r}: {exc}") from None
    bearer = (cfg.api_key or {}).get("BearerToken") or ""
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        username=cfg.username or None,
        password=cfg.password or None,
        token=bearer.removeprefix("Bearer ") or None,
        proxy_url=cfg.proxy,
    )
