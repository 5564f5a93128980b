"""`servegraph demo`: the whole flow on this machine, with real parts only.

A real kube-apiserver + etcd (RBAC on) and the real KubeRay operator, a sample
graph registry over HTTPS that requires a bearer token, and the servegraph
operator as its own process with the shipped ClusterRole. The `heterogeneous`
sample is published and a ServeGraph applied; KubeRay then builds the Ray
cluster (its pods stay Pending: there is no kubelet here).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import secrets
import signal
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "demo"
GRAPH = "heterogeneous"


def add_arguments(subparsers: Any) -> None:
    p = subparsers.add_parser("demo", help="run the operator on an embedded control plane with a sample registry")
    p.add_argument("--duration", type=float, default=0, help="stop after this many seconds (default: until Ctrl-C)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_demo(args.duration))


def say(text: str) -> None:
    print(text, flush=True)


async def _demo(duration: float) -> int:
    from servegraph.registry.server import Registry, RegistryServer
    from servegraph.testenv import ControlPlane, KubeRayOperator, find_binaries
    from servegraph.testenv.certs import write_pki
    from servegraph.testenv.processes import free_port, http_probe

    binaries = find_binaries()
    with contextlib.ExitStack() as stack:
        say("starting etcd and kube-apiserver (RBAC on) ...")
        cp = stack.enter_context(ControlPlane(binaries, crds=[binaries.kuberay_crds, ROOT / "config" / "crd"]))
        say("starting the KubeRay operator ...")
        stack.enter_context(KubeRayOperator(cp))

        pki = write_pki(Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="servegraph-demo-"))))
        server_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ssl.load_cert_chain(pki.serving_cert, pki.serving_key)
        token = secrets.token_urlsafe(24)
        registry = await RegistryServer(Registry(token=token), server_ssl).start()
        try:
            registry.registry.publish(GRAPH, (ROOT / "config" / "samples" / f"{GRAPH}.pb").read_bytes())
            say(f"sample graph registry at {registry.base_url} (bearer token required)")

            cp.kubectl("apply", "-f", str(ROOT / "config" / "rbac" / "role.yaml"))
            cp.kubectl(
                "create", "clusterrolebinding", "servegraph-operator",
                "--clusterrole=servegraph-operator", "--user=servegraph-operator",
            )  # fmt: skip
            port = free_port()
            argv = [sys.executable, "-m", "servegraph.cli", "run", "--health-address", f"127.0.0.1:{port}"]
            operator = cp.spawn(
                "servegraph-operator", argv, identity="servegraph-operator", env={"PYTHONUNBUFFERED": "1"}
            )
            operator.wait_ready(lambda: http_probe(f"http://127.0.0.1:{port}/readyz"), timeout=60)
            say("servegraph operator running as `servegraph-operator`, bound only by config/rbac/role.yaml")

            cp.kubectl("create", "namespace", NAMESPACE)
            cp.kubectl("apply", "-f", "-", stdin=_manifests(registry.url(GRAPH), token, pki.ca_cert.read_text()))
            say(
                f"applied ServeGraph {NAMESPACE}/{GRAPH} and its token Secret; waiting for the RayService and RayCluster ..."
            )
            await _wait_for_cluster(cp)

            say("")
            say(cp.kubectl("get", "servegraphs,rayservices,rayclusters", "-n", NAMESPACE).stdout)
            rendered = cp.kubectl(
                "get", "rayservice", GRAPH, "-n", NAMESPACE, "-o", "jsonpath={.spec.serveConfigV2}"
            ).stdout
            say("serveConfigV2 rendered from the graph:\n")
            say(rendered)
            say(f"export KUBECONFIG={cp.kubeconfig('admin')}")
            say(f"alias kubectl={binaries.kubectl}")
            say("explore with: kubectl get servegraphs -n demo -o yaml   (Ctrl-C stops and removes everything)")
            await _wait_until_stopped(duration)
        finally:
            await registry.stop()
        say("stopping ...")
    return 0


def _manifests(url: str, token: str, ca_pem: str) -> str:
    def b64(text: str) -> str:
        return base64.b64encode(text.encode()).decode()

    return f"""
apiVersion: v1
kind: Secret
metadata: {{name: registry-token, namespace: {NAMESPACE}}}
data: {{token: {b64(token)}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: registry-ca, namespace: {NAMESPACE}}}
data: {{ca.crt: {b64(ca_pem)}}}
---
apiVersion: servegraph.io/v1alpha1
kind: ServeGraph
metadata: {{name: {GRAPH}, namespace: {NAMESPACE}}}
spec:
  source:
    url: {url}
    tokenSecretRef: {{name: registry-token}}
    caBundle: {{secretRef: {{name: registry-ca}}}}
"""


async def _wait_for_cluster(cp: Any, within: float = 120) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        out = cp.kubectl("get", "rayclusters", "-n", NAMESPACE, "-o", "name", check=False)
        if out.returncode == 0 and out.stdout.strip():
            return
        await asyncio.sleep(1)
    status = cp.kubectl("get", "servegraph", GRAPH, "-n", NAMESPACE, "-o", "yaml", check=False).stdout
    raise SystemExit(f"demo: no RayCluster after {within:.0f} s; ServeGraph:\n{status}")


async def _wait_until_stopped(duration: float) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=duration or None)
