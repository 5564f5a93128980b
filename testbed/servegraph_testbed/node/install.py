"""Install the stack onto a NodeCluster as a user installs it.

- the ServeGraph CRD from config/crd (kustomize);
- KubeRay from its own kustomize install (ray-operator/config/default of the module the
  operator was built from), with only its image swapped for the one built here;
- servegraph from our Helm chart, with its defaults (two replicas, leader election, the
  events endpoint) and the operator image built from docker/operator.Dockerfile; or, as
  docs/install.md's other way, `kubectl apply -k config/default` (`install_servegraph_kustomize`).
"""

from __future__ import annotations

import base64
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from servegraph_testbed.binaries import REPO_ROOT
from servegraph_testbed.node.cluster import NodeCluster
from servegraph_testbed.node.gateway import GATEWAY_CLASS, PUBLIC_GATEWAY
from servegraph_testbed.node.gateway import NAMESPACE as GATEWAY_NAMESPACE

KUBERAY_NAMESPACE = "default"  # where KubeRay's config/default puts it
SERVEGRAPH_NAMESPACE = "servegraph-system"
SERVEGRAPH_RELEASE = "servegraph-operator"
OPERATOR_DEPLOYMENT = "servegraph-operator"
EVENTS_SECRET = "servegraph-events"  # noqa: S105 (a Secret's name, not a password)
KUSTOMIZE_EVENTS_SECRET = "servegraph-operator-events-token"  # noqa: S105 (config/manager's name for it)


@dataclass(frozen=True)
class Installed:
    """What the installs return that tests and the demo need."""

    events_token: str
    operator_deployment: str = OPERATOR_DEPLOYMENT
    operator_namespace: str = SERVEGRAPH_NAMESPACE


def install_crd(cluster: NodeCluster) -> None:
    cluster.cp.kubectl("apply", "--server-side", "-k", str(REPO_ROOT / "config" / "crd"))
    cluster.cp.kubectl("wait", "--for=condition=Established", "--timeout=180s", "crd/servegraphs.servegraph.io")


def install_kuberay(cluster: NodeCluster) -> None:
    """`kubectl apply -k` of KubeRay's config/default, image swapped by a kustomize overlay."""
    cp = cluster.cp
    overlay = _image_overlay(cluster, cp.binaries.kuberay_config, "kuberay", "quay.io/kuberay/operator")
    # Server-side: KubeRay's CRDs are too large for client-side apply's annotation.
    cp.kubectl("apply", "--server-side", "-k", str(overlay))
    cluster.wait_rollout(KUBERAY_NAMESPACE, "deployment/kuberay-operator")


def install_servegraph(
    cluster: NodeCluster, *, replicas: int = 2, extra_values: dict[str, str] | None = None
) -> Installed:
    """`helm install` of charts/servegraph-operator (the CRD comes from install_crd)."""
    cp = cluster.cp
    token = _events_secret(cluster, EVENTS_SECRET)
    values = {
        "replicaCount": str(replicas),
        "events.tokenSecret.name": EVENTS_SECRET,
        # Traefik's class for KubeRay's incremental upgrade, and the administrator's Gateway
        # `public` beside Traefik for spec.expose (node/gateway.py).
        "allowedGatewayClasses": f"{{{GATEWAY_CLASS}}}",
        "allowedGateways": f"{{{GATEWAY_NAMESPACE}/{PUBLIC_GATEWAY}}}",
        **(extra_values or {}),
    }
    args = ["install", SERVEGRAPH_RELEASE, str(REPO_ROOT / "charts" / "servegraph-operator")]
    args += ["--namespace", SERVEGRAPH_NAMESPACE, "--skip-crds"]
    for key, value in values.items():
        args += ["--set", f"{key}={value}"]
    cp.helm(*args)
    cluster.wait_rollout(SERVEGRAPH_NAMESPACE, f"deployment/{OPERATOR_DEPLOYMENT}")
    return Installed(events_token=token)


def upgrade_servegraph(cluster: NodeCluster, values: dict[str, str]) -> None:
    """`helm upgrade --reuse-values` of the installed chart with `values` changed, as an
    administrator changes a flag; waits until every replica runs the new pod template."""
    args = ["upgrade", SERVEGRAPH_RELEASE, str(REPO_ROOT / "charts" / "servegraph-operator")]
    args += ["--namespace", SERVEGRAPH_NAMESPACE, "--skip-crds", "--reuse-values"]
    for key, value in values.items():
        args += ["--set", f"{key}={value}"]
    cluster.cp.helm(*args)
    cluster.wait_rollout(SERVEGRAPH_NAMESPACE, f"deployment/{OPERATOR_DEPLOYMENT}")


def install_servegraph_kustomize(cluster: NodeCluster, *, replicas: int = 2) -> Installed:
    """`kubectl apply --server-side -k` of config/default as docs/install.md says (the CRD
    again, the RBAC, the Deployment, its Service and PDB), after the events token Secret
    config/manager names; an overlay sets only the image built here and the replicas."""
    cp = cluster.cp
    token = _events_secret(cluster, KUSTOMIZE_EVENTS_SECRET)
    replicas_yaml = f"replicas:\n  - name: {OPERATOR_DEPLOYMENT}\n    count: {replicas}\n"
    overlay = _image_overlay(
        cluster, REPO_ROOT / "config", "operator", "ghcr.io/servegraph/servegraph-operator", replicas_yaml
    )
    cp.kubectl("apply", "--server-side", "-k", str(overlay))
    cluster.wait_rollout(SERVEGRAPH_NAMESPACE, f"deployment/{OPERATOR_DEPLOYMENT}")
    return Installed(events_token=token)


def _image_overlay(cluster: NodeCluster, config: Path, role: str, image: str, extra: str = "") -> Path:
    """A copy of a kustomize `config` tree with an overlay on its `default` that swaps `image`
    for the one built here for `role` (and adds `extra`, kustomization YAML)."""
    tree = cluster.cp.workdir / f"{role}-config"
    if not tree.exists():
        shutil.copytree(config, tree)
    overlay = tree / "servegraph-testbed"
    overlay.mkdir(exist_ok=True)
    repository, _, tag = cluster.images.ref(role).rpartition(":")
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        "resources: [../default]\n"
        "images:\n"
        f"  - name: {image}\n"
        f"    newName: {repository}\n"
        f"    newTag: {tag}\n" + extra
    )
    return overlay


def _events_secret(cluster: NodeCluster, name: str) -> str:
    """The operator's namespace and the events endpoint's token Secret, made before the
    operator (it reads the token on demand, so either order works; this one skips a 401)."""
    token = secrets.token_urlsafe(24)
    cluster.cp.kubectl("create", "namespace", SERVEGRAPH_NAMESPACE)
    cluster.cp.kubectl(
        "apply",
        "-f",
        "-",
        stdin=(
            "apiVersion: v1\nkind: Secret\n"
            f"metadata: {{name: {name}, namespace: {SERVEGRAPH_NAMESPACE}}}\n"
            f"data: {{token: {base64.b64encode(token.encode()).decode()}}}\n"
        ),
    )
    return token
