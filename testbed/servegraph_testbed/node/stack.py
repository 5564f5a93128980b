"""Install the stack onto a NodeCluster as a user installs it.

- the ServeGraph CRD from config/crd (kustomize);
- KubeRay from its own kustomize install (ray-operator/config/default of the module the
  operator was built from), with only its image swapped for the one built here;
- servegraph from our Helm chart, with its defaults (two replicas, leader election, the
  events endpoint) and the operator image built from docker/operator.Dockerfile.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import shutil
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import yaml

from servegraph_testbed.binaries import REPO_ROOT
from servegraph_testbed.certs import write_pki
from servegraph_testbed.controlplane import ControlPlane
from servegraph_testbed.node.cluster import NodeCluster
from servegraph_testbed.node.network import NodeNetwork
from servegraph_testbed.registry import Registry, RegistryServer

KUBERAY_NAMESPACE = "default"  # where KubeRay's config/default puts it
SERVEGRAPH_NAMESPACE = "servegraph-system"
SERVEGRAPH_RELEASE = "servegraph-operator"
OPERATOR_DEPLOYMENT = "servegraph-operator"
EVENTS_SECRET = "servegraph-events"  # noqa: S105 (a Secret's name, not a password)


@dataclass(frozen=True)
class Installed:
    """What the installs return that tests and the demo need."""

    events_token: str
    operator_deployment: str = OPERATOR_DEPLOYMENT
    operator_namespace: str = SERVEGRAPH_NAMESPACE


def install_crd(cluster: NodeCluster) -> None:
    cluster.cp.kubectl("apply", "--server-side", "-k", str(REPO_ROOT / "config" / "crd"))
    cluster.cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/servegraphs.servegraph.io")


def install_kuberay(cluster: NodeCluster) -> None:
    """`kubectl apply -k` of KubeRay's config/default, image swapped by a kustomize overlay."""
    cp = cluster.cp
    tree = cp.workdir / "kuberay-config"
    if not tree.exists():
        shutil.copytree(cp.binaries.kuberay_config, tree)
    overlay = tree / "servegraph-testbed"
    overlay.mkdir(exist_ok=True)
    repository, _, tag = cluster.images.ref("kuberay").rpartition(":")
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        "resources: [../default]\n"
        "images:\n"
        "  - name: quay.io/kuberay/operator\n"
        f"    newName: {repository}\n"
        f"    newTag: {tag}\n"
    )
    # Server-side: KubeRay's CRDs are too large for client-side apply's annotation.
    cp.kubectl("apply", "--server-side", "-k", str(overlay))
    cluster.wait_rollout(KUBERAY_NAMESPACE, "deployment/kuberay-operator")


def install_servegraph(
    cluster: NodeCluster, *, replicas: int = 2, extra_values: dict[str, str] | None = None
) -> Installed:
    """`helm install` of charts/servegraph-operator (the CRD comes from install_crd)."""
    cp = cluster.cp
    token = secrets.token_urlsafe(24)
    cp.kubectl("create", "namespace", SERVEGRAPH_NAMESPACE)
    cp.kubectl(
        "apply",
        "-f",
        "-",
        stdin=(
            "apiVersion: v1\nkind: Secret\n"
            f"metadata: {{name: {EVENTS_SECRET}, namespace: {SERVEGRAPH_NAMESPACE}}}\n"
            f"data: {{token: {base64.b64encode(token.encode()).decode()}}}\n"
        ),
    )
    values = {
        "replicaCount": str(replicas),
        "events.tokenSecret.name": EVENTS_SECRET,
        **(extra_values or {}),
    }
    args = ["install", SERVEGRAPH_RELEASE, str(REPO_ROOT / "charts" / "servegraph-operator")]
    args += ["--namespace", SERVEGRAPH_NAMESPACE, "--skip-crds"]
    for key, value in values.items():
        args += ["--set", f"{key}={value}"]
    cp.helm(*args)
    cluster.wait_rollout(SERVEGRAPH_NAMESPACE, f"deployment/{OPERATOR_DEPLOYMENT}")
    return Installed(events_token=token)


@dataclass(frozen=True)
class GraphRef:
    """Where a ServeGraph's RayService serves: its namespace, names and route."""

    namespace: str
    name: str
    rayservice: str
    route: str


class Stack:
    """A NodeCluster with KubeRay, servegraph and an HTTPS graph registry on the host.

    The registry listens on the host's end of the node's veth, with a certificate for
    that address; ServeGraphs get its CA through a Secret, the read token through another.
    Publishing uses the registry's own authenticated PUT, and "graph published" events
    go to the operator's Service, as a registry's webhook would send them.

        async with Stack() as stack:
            ref = await stack.deploy("demo", "mini", graph_bytes, rayservice_overrides)
    """

    def __init__(self, cluster: NodeCluster | None = None, *, operator_replicas: int = 2) -> None:
        self.cluster = cluster or NodeCluster(gpus=2)
        self.operator_replicas = operator_replicas
        self.read_token = secrets.token_urlsafe(24)
        self.publish_token = secrets.token_urlsafe(24)
        self.installed: Installed | None = None
        self.registry: RegistryServer | None = None
        self._ca_pem = ""
        self.timings: dict[str, float] = {}

    async def __aenter__(self) -> Stack:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> Stack:
        t0 = time.monotonic()
        try:
            await asyncio.to_thread(self.cluster.start)
            self.timings.update(self.cluster.timings)
            await asyncio.to_thread(install_crd, self.cluster)
            await asyncio.to_thread(install_kuberay, self.cluster)
            self.timings["KubeRay ready"] = round(time.monotonic() - t0, 2)
            self.installed = await asyncio.to_thread(install_servegraph, self.cluster, replicas=self.operator_replicas)
            self.timings["servegraph ready"] = round(time.monotonic() - t0, 2)
            pki_dir = self.cluster.cp.workdir / "registry-pki"
            pki_dir.mkdir()
            pki = write_pki(pki_dir, ips=[self.net.host_ip])
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(pki.serving_cert, pki.serving_key)
            self._ca_pem = pki.ca_cert.read_text()
            self._client_ssl = ssl.create_default_context(cafile=str(pki.ca_cert))
            registry = Registry(token=self.read_token, publish_token=self.publish_token)
            self.registry = await RegistryServer(registry, ctx, host=self.net.host_ip).start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def stop(self) -> None:
        if self.registry is not None:
            await self.registry.stop()
            self.registry = None
        await asyncio.to_thread(self.cluster.stop)

    @property
    def net(self) -> NodeNetwork:
        assert self.cluster.net is not None
        return self.cluster.net

    @property
    def cp(self) -> ControlPlane:
        return self.cluster.cp

    # ---- graphs ----------------------------------------------------------------------

    def source_url(self, graph: str) -> str:
        assert self.registry is not None
        return self.registry.url(graph)

    async def publish(self, graph: str, data: bytes) -> str:
        """The registry's publish call (PUT with the publish token); returns the ETag."""
        async with (
            aiohttp.ClientSession() as session,
            session.put(
                self.source_url(graph),
                data=data,
                headers={"Authorization": f"Bearer {self.publish_token}"},
                ssl=self._client_ssl,
            ) as resp,
        ):
            text = await resp.text()
            if resp.status != 201:
                raise RuntimeError(f"publish {graph}: HTTP {resp.status}: {text.strip()}")
            return resp.headers["ETag"]

    async def post_published_event(self, graph: str) -> dict[str, Any]:
        """POST the "graph published" CloudEvent to the operator's Service (events port).

        A short connect timeout, as a publisher should use: right after an operator pod
        dies, kube-proxy may still send a connection to it, and that connection never
        answers (aiohttp's default waits 30 s before giving up); a quick retry reaches
        the live replica instead."""
        assert self.installed is not None
        ip = self.service_ip(self.installed.operator_namespace, self.installed.operator_deployment)
        headers = {
            "Authorization": f"Bearer {self.installed.events_token}",
            "ce-specversion": "1.0",
            "ce-type": "io.servegraph.graph.published",
            "ce-source": "servegraph-testbed/registry",
            "ce-id": secrets.token_hex(8),
            "ce-subject": self.source_url(graph),
            "Content-Type": "application/json",
        }
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30, sock_connect=3)) as session,
            session.post(f"http://{ip}:8081/v1/events", data=b"{}", headers=headers) as resp,
        ):
            body: dict[str, Any] = await resp.json()
            if resp.status != 202:
                raise RuntimeError(f"events endpoint: HTTP {resp.status}: {body}")
            return body

    def servegraph_manifest(
        self,
        namespace: str,
        name: str,
        graph: str,
        ray_service: Mapping[str, Any] | None = None,
        rollout: Mapping[str, Any] | None = None,
    ) -> str:
        """Namespace, the token and CA Secrets, and the ServeGraph, as one YAML stream."""
        docs: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "registry-token", "namespace": namespace},
                "stringData": {"token": self.read_token},
            },
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "registry-ca", "namespace": namespace},
                "stringData": {"ca.crt": self._ca_pem},
            },
            {
                "apiVersion": "servegraph.io/v1alpha1",
                "kind": "ServeGraph",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "source": {
                        "url": self.source_url(graph),
                        "tokenSecretRef": {"name": "registry-token"},
                        "caBundle": {"secretRef": {"name": "registry-ca"}},
                    },
                    **({"rayService": dict(ray_service)} if ray_service else {}),
                    **({"rollout": dict(rollout)} if rollout else {}),
                },
            },
        ]
        return yaml.safe_dump_all(docs, sort_keys=False)

    def apply(self, manifest: str) -> None:
        self.cp.kubectl("apply", "-f", "-", stdin=manifest)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        where = ["-n", namespace] if namespace else []
        out = self.cp.kubectl("get", kind, name, *where, "-o", "json", check=False)
        if out.returncode != 0:
            if "NotFound" in out.stderr:
                return None
            raise RuntimeError(out.stderr.strip())
        obj: dict[str, Any] = json.loads(out.stdout)
        return obj

    def service_ip(self, namespace: str, name: str) -> str:
        svc = self.get("service", namespace, name)
        if svc is None:
            raise LookupError(f"no Service {namespace}/{name}")
        ip: str = svc["spec"]["clusterIP"]
        if not self.net.in_pod_network(ip):  # test traffic goes only to networks we made
            raise RuntimeError(f"Service {namespace}/{name} has {ip}, outside the node's Service range")
        return ip

    def serve_url(self, namespace: str, rayservice: str, route: str) -> str:
        """The graph's route through KubeRay's serve Service (kube-proxy's ClusterIP)."""
        return f"http://{self.service_ip(namespace, f'{rayservice}-serve-svc')}:8000{route}"


async def ask(url: str, payload: Any, limit_s: float = 10.0) -> tuple[int, Any]:
    """POST a JSON payload to a graph route: (status, decoded body or text).

    The connect timeout is short: on this node a connection is set up in milliseconds, or
    in about 1 s when kube-proxy drops its first SYN (TCP retries at 1 s and 3 s); one still
    not set up after 5 s is lost, and waiting out the whole `limit_s` on it only hides that.
    """
    timeout = aiohttp.ClientTimeout(total=limit_s, sock_connect=min(5.0, limit_s))
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(url, json=payload) as resp,
    ):
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text


async def answer(
    url: str, payload: Any, within: float = 90.0, lost: list[str] | None = None, limit_s: float = 15.0
) -> tuple[int, Any]:
    """The graph's first response to `payload`, sending again a request lost on its way.

    A connection made in the instant a Service's first endpoint becomes ready can be
    dropped inside the node, TCP's resends with it (docs/testenv.md, "Requests right
    after Ready"), and KubeRay reports Ready in about that instant. So a lost request
    (refused, never connected, no response in `limit_s`) is sent again on a new
    connection, as any client of a Service should, and each loss is appended to `lost`
    for the test to report. Any HTTP response is returned at once, whatever its status:
    a wrong answer is the caller's to judge.
    """
    losses = lost if lost is not None else []
    started = time.monotonic()
    while True:
        try:
            return await ask(url, payload, limit_s=limit_s)
        except (aiohttp.ClientError, TimeoutError) as e:
            losses.append(f"+{time.monotonic() - started:.1f}s {type(e).__name__}")
            if time.monotonic() - started > within:
                raise AssertionError(f"no response from {url} within {within:.0f} s: {losses}") from e
        await asyncio.sleep(1)
