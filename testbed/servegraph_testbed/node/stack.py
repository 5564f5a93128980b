"""A NodeCluster with the stack installed (node/install.py, node/gateway.py) and an HTTPS graph registry."""

from __future__ import annotations

import asyncio
import json
import secrets
import ssl
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import yaml

from servegraph_testbed.certs import write_pki
from servegraph_testbed.controlplane import ControlPlane
from servegraph_testbed.node.cluster import NodeCluster
from servegraph_testbed.node.gateway import install_gateway
from servegraph_testbed.node.install import (
    Installed,
    install_crd,
    install_kuberay,
    install_servegraph,
    install_servegraph_kustomize,
)
from servegraph_testbed.node.network import NodeNetwork
from servegraph_testbed.registry import Registry, RegistryServer


class Stack:
    """A NodeCluster with KubeRay, a Gateway API implementation (Traefik), servegraph and
    an HTTPS graph registry on the host.

    The registry listens on the host's end of the node's veth, with a certificate for
    that address; ServeGraphs get its CA through a Secret, the read token through another.
    Publishing uses the registry's own authenticated PUT, and "graph published" events
    go to the operator's Service, as a registry's webhook would send them.

        async with Stack() as stack:
            await stack.publish("demo-mini", graph_bytes)
            stack.apply(stack.servegraph_manifest("demo", "mini", "demo-mini"))
    """

    def __init__(
        self, cluster: NodeCluster | None = None, *, operator_replicas: int = 2, install: str = "helm"
    ) -> None:
        """`install`: "helm" (charts/servegraph-operator) or "kustomize" (config/default)."""
        self.cluster = cluster or NodeCluster(gpus=2)
        self.operator_replicas = operator_replicas
        self.install = {"helm": install_servegraph, "kustomize": install_servegraph_kustomize}[install]
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
            await asyncio.to_thread(install_gateway, self.cluster)
            self.timings["gateway ready"] = round(time.monotonic() - t0, 2)
            self.installed = await asyncio.to_thread(self.install, self.cluster, replicas=self.operator_replicas)
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
        # As a sender should: again on a connection that does not answer, on 5xx and 429 (a
        # replica that has not listed its ServeGraphs yet answers 503), for up to a minute.
        deadline = time.monotonic() + 60
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30, sock_connect=3)) as session:
            while True:
                try:
                    async with session.post(f"http://{ip}:8081/v1/events", data=b"{}", headers=headers) as resp:
                        body: dict[str, Any] = await resp.json(content_type=None)
                        if resp.status == 202:
                            return body
                        why = f"HTTP {resp.status}: {body}"
                        if resp.status < 500 and resp.status != 429:
                            raise RuntimeError(f"events endpoint: {why}")
                except (aiohttp.ClientConnectionError, TimeoutError) as exc:
                    why = f"{type(exc).__name__}: {exc}"
                if time.monotonic() > deadline:
                    raise RuntimeError(f"events endpoint: not accepted within 60 s; last: {why}")
                await asyncio.sleep(1)

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
