"""A real Prometheus on the host, scraping the node's pods as the shipped monitors say.

Prometheus (built by hack/testenv/build.sh) runs as a process of the control plane
(stopped with it, by process group), finds pods with Kubernetes service discovery
through the API server, and scrapes them directly: the host routes the node's pod
range through the veth (network.py), so no port-forward is needed.

Its scrape jobs are translated from the manifests users install — config/prometheus's
ServiceMonitor (the operator) and PodMonitor (the Ray pods) — the way the Prometheus
Operator translates them: keep the targets whose labels match the selector and whose
port has the endpoint's name. A monitor selecting the wrong pods or port fails here.
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from servegraph_testbed.binaries import REPO_ROOT
from servegraph_testbed.controlplane import ControlPlane
from servegraph_testbed.node.cluster import NodeCluster
from servegraph_testbed.processes import Component, free_port

MONITORS = REPO_ROOT / "config" / "prometheus"
COMPONENT = "prometheus"
READER_ROLE = "servegraph-operator-metrics-reader"
"""The ClusterRole that lets a token read the operator's /metrics (chart and kustomize)."""
SCRAPER = ("monitoring", "prometheus")
"""Namespace and ServiceAccount whose token Prometheus scrapes with, as an in-cluster
Prometheus would (its pod's projected token; here minted by the TokenRequest API)."""


def reader_token(cp: ControlPlane, role: str = READER_ROLE) -> str:
    """A real ServiceAccount token bound to `role`: what a Prometheus granted by the
    install docs presents, checked by the operator with TokenReview and SubjectAccessReview."""
    namespace, account = SCRAPER
    token = cp.service_account_token(namespace, account)  # creates the namespace and account
    binding = f"""
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {account}-servegraph-metrics}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {role}}}
subjects: [{{kind: ServiceAccount, name: {account}, namespace: {namespace}}}]
"""
    cp.kubectl("apply", "-f", "-", stdin=binding)
    return token


def _label(name: str) -> str:
    """A Kubernetes label name as Prometheus' discovery meta label spells it."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def scrape_job(monitor: Mapping[str, Any], kubeconfig: Path, interval: str, token_file: Path) -> dict[str, Any]:
    """One scrape job for a ServiceMonitor (EndpointSlices of the selected Services) or a
    PodMonitor (the selected pods). An endpoint's `bearerTokenFile` (the Prometheus pod's
    own token) becomes `token_file`, Prometheus' ServiceAccount token on this host."""
    spec, meta = monitor["spec"], monitor["metadata"]
    pod_monitor = monitor["kind"] == "PodMonitor"
    role = "pod" if pod_monitor else "endpointslice"
    owner = "pod" if pod_monitor else "service"
    [endpoint] = spec["podMetricsEndpoints" if pod_monitor else "endpoints"]
    relabel: list[dict[str, Any]] = [
        {
            "action": "keep",
            "source_labels": [f"__meta_kubernetes_{owner}_label_{_label(key)}"],
            "regex": re.escape(value),
        }
        for key, value in sorted(spec["selector"]["matchLabels"].items())
    ]
    port_label = (
        "__meta_kubernetes_pod_container_port_name" if pod_monitor else "__meta_kubernetes_endpointslice_port_name"
    )
    relabel += [
        {"action": "keep", "source_labels": [port_label], "regex": re.escape(endpoint["port"])},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
    ]
    sd: dict[str, Any] = {"role": role, "kubeconfig_file": str(kubeconfig)}
    selector = spec.get("namespaceSelector") or {}
    if not selector.get("any"):
        sd["namespaces"] = {"names": selector.get("matchNames") or [meta["namespace"]]}
    job: dict[str, Any] = {
        "job_name": f"{monitor['kind'].lower()}/{meta['namespace']}/{meta['name']}",
        "scrape_interval": interval,
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "metrics_path": endpoint.get("path", "/metrics"),
        "kubernetes_sd_configs": [sd],
        "relabel_configs": relabel,
    }
    if endpoint.get("bearerTokenFile"):
        job["authorization"] = {"type": "Bearer", "credentials_file": str(token_file)}
    return job


def config_from_monitors(kubeconfig: Path, token_file: Path, interval: str = "2s") -> dict[str, Any]:
    """prometheus.yml scraping what config/prometheus's monitors select."""
    docs = [d for f in sorted(MONITORS.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    monitors = [d for d in docs if d.get("kind") in ("ServiceMonitor", "PodMonitor")]
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [scrape_job(m, kubeconfig, interval, token_file) for m in monitors],
    }


class Prometheus:
    """`with Prometheus(cluster) as prom: prom.query('up')` — started on a loopback port."""

    def __init__(self, cluster: NodeCluster, *, interval: str = "2s", host: str = "127.0.0.1") -> None:
        """`host`: the address it listens on; the host's end of the node's veth
        (`NodeCluster.net.host_ip`) lets pods query it, as an operator with --prometheus-url does."""
        self.cluster = cluster
        self.interval = interval
        self.host = host
        self.port = 0
        self._component: Component | None = None

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> Prometheus:
        cp = self.cluster.cp
        binary = cp.binaries.prometheus
        if not binary.is_file():
            raise FileNotFoundError(f"{binary} missing: run hack/testenv/build.sh (node tier) and use its directory")
        work = cp.workdir / COMPONENT
        (work / "data").mkdir(parents=True, exist_ok=True)
        token_file = work / "token"
        token_file.write_text(reader_token(cp))
        token_file.chmod(0o600)
        config = work / "prometheus.yml"
        monitors = config_from_monitors(cp.kubeconfig(), token_file, self.interval)
        config.write_text(yaml.safe_dump(monitors, sort_keys=False))
        self.port = free_port(self.host)
        argv = [
            str(binary),
            f"--config.file={config}",
            f"--storage.tsdb.path={work / 'data'}",
            "--storage.tsdb.retention.time=2h",
            f"--web.listen-address={self.host}:{self.port}",
            "--log.level=warn",
        ]
        self._component = cp.spawn(COMPONENT, argv, identity=None)
        self._component.wait_ready(self._ready, timeout)
        return self

    def stop(self) -> None:
        if self._component is not None:
            self.cluster.cp.unspawn(self._component)
            self._component = None

    def _ready(self) -> tuple[bool, str]:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:  # noqa: S310 (the test's own Prometheus)
                return resp.status == 200, ""
        except OSError as e:
            return False, str(e)

    def _get(self, path: str, **params: str) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 (the test's own Prometheus)
            doc = json.loads(resp.read())
        if doc.get("status") != "success":
            raise RuntimeError(f"Prometheus {path} {params}: {doc}")
        return doc["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query: [{"metric": {labels}, "value": [t, "v"]}] for a vector, [] for none."""
        data = self._get("/api/v1/query", query=expr)
        if data["resultType"] != "vector":
            raise RuntimeError(f"{expr}: a {data['resultType']}, not a vector")
        result: list[dict[str, Any]] = data["result"]
        return result

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets with their job, labels, health and last error."""
        active: list[dict[str, Any]] = self._get("/api/v1/targets", state="active")["activeTargets"]
        return active
