"""Who may talk to the test API server: static bearer-token identities, real ServiceAccount
tokens, and their kubeconfigs.

A static token file lets a test run a component as exactly the user its RBAC manifests
bind (any user name, including `system:serviceaccount:<ns>:<name>`), without the
token controller a real cluster would need. Where the token itself is under test, a
bound ServiceAccount token comes from the TokenRequest API, as in a cluster.
"""

from __future__ import annotations

import base64
import csv
import io
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from servegraph_testbed.rest import Rest

ADMIN = "admin"


@dataclass(frozen=True)
class Identity:
    """A static user: `name` keys its kubeconfig, `user` and `groups` are what RBAC sees."""

    name: str
    user: str
    groups: tuple[str, ...] = ()
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24), repr=False)

    @classmethod
    def service_account(cls, namespace: str, name: str) -> Identity:
        """An identity RBAC treats exactly like the ServiceAccount `namespace/name`."""
        return cls(
            name=name,
            user=f"system:serviceaccount:{namespace}:{name}",
            groups=("system:serviceaccounts", f"system:serviceaccounts:{namespace}"),
        )


def default_identities() -> tuple[Identity, ...]:
    """admin (system:masters) plus restricted users that start with no permissions at all."""
    return (
        Identity(ADMIN, "admin", ("system:masters",)),
        Identity("servegraph-operator", "servegraph-operator"),
        Identity("kuberay-operator", "kuberay-operator"),
        Identity("restricted-user", "restricted-user"),
    )


def write_token_file(path: Path, identities: Iterable[Identity]) -> None:
    """kube-apiserver's --token-auth-file: CSV `token,user,uid,"group1,group2"`."""
    out = io.StringIO()
    writer = csv.writer(out, quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
    for ident in identities:
        row = [ident.token, ident.user, ident.user]
        if ident.groups:
            row.append(",".join(ident.groups))
        writer.writerow(row)
    path.write_text(out.getvalue())
    path.chmod(0o600)


def write_kubeconfig(path: Path, server: str, ca_pem: bytes, identity: Identity) -> None:
    """A self-contained kubeconfig (CA inline, bearer token) for one identity."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "servegraph-testenv",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": identity.name, "user": {"token": identity.token}}],
        "contexts": [
            {
                "name": identity.name,
                "context": {"cluster": "servegraph-testenv", "user": identity.name},
            }
        ],
        "current-context": identity.name,
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)


def service_account_token(rest: Rest, namespace: str, name: str, expiration_seconds: int = 86400) -> str:
    """A real bound token (TokenRequest API) of ServiceAccount `namespace/name`, asked as `rest`.

    RBAC bindings to that ServiceAccount apply to it exactly as in a cluster. The
    namespace and ServiceAccount are created if missing.
    """
    rest.apply(
        f"/api/v1/namespaces/{namespace}",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
    )
    sa_path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}"
    rest.apply(sa_path, {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    review = rest.request(
        "POST",
        f"{sa_path}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": expiration_seconds},
        },
    )
    token: str = review["status"]["token"]
    return token
