"""DAG + overrides → a KubeRay RayService (ray.io/v1) manifest.

Pure: the operator and `servegraph render` call the same function with the same
inputs and get the same dict, including the spec-hash annotation the operator
compares against the live object to skip needless writes.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from servegraph import __version__
from servegraph.collector import collector_paused
from servegraph.graph import model
from servegraph.render.serve_config import SERVE_HTTP_PORT, serve_config_yaml
from servegraph.render.workers import GiB, WorkerGroupPlan, plan_worker_groups, uses_autoscaling

DEFAULT_RAY_VERSION = "2.60.0"
# Ray with the servegraph runtime installed (docker/ray.Dockerfile): the plain
# rayproject/ray image cannot import servegraph.runtime:build. GPU graphs get
# the image built on Ray's CUDA base.
DEFAULT_IMAGE = f"ghcr.io/servegraph/servegraph-ray:{__version__}"
SPEC_HASH_ANNOTATION = "servegraph.io/spec-hash"
GRAPH_LABEL = "servegraph.io/graph"
MAX_NAME = 47  # KubeRay rejects longer RayService names (derived object names must fit 63).
HEAD_RESOURCES = {"cpu": "2", "memory": "8Gi"}

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class PodOverrides:
    """What a ServeGraph may change in the generated head or worker pods."""

    service_account_name: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    resources: Mapping[str, Any] | None = None
    env: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class RayServiceOptions:
    name: str
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    image: str | None = None
    ray_version: str | None = None
    head: PodOverrides = PodOverrides()
    workers: PodOverrides = PodOverrides()
    upgrade_strategy: str | None = None
    serve_service: Mapping[str, Any] | None = None
    suspend: bool | None = None
    owner_references: tuple[Mapping[str, Any], ...] = ()


def rayservice_name(name: str) -> str:
    """A valid RayService name for any Kubernetes object name.

    Valid short names pass unchanged; others are slugged and, when cut to fit
    KubeRay's 47 characters, suffixed with a hash so two long names cannot collide.
    """
    if len(name) <= MAX_NAME and _DNS1035.match(name):
        return name
    slug = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    if not slug or not slug[0].isalpha():
        slug = "sg-" + slug
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{slug[: MAX_NAME - 9].rstrip('-')}-{digest}"


@collector_paused
def render_rayservice(graph: model.Graph, options: RayServiceOptions) -> dict[str, Any]:
    """The RayService manifest, with a spec-hash annotation over everything we own."""
    name = rayservice_name(options.name)
    plans = plan_worker_groups(graph)
    default_image = DEFAULT_IMAGE + ("-gpu" if any(p.gpus for p in plans) else "")
    image = options.image or graph.cluster.image or default_image
    ray_version = options.ray_version or graph.cluster.ray_version or DEFAULT_RAY_VERSION
    cluster: dict[str, Any] = {"rayVersion": ray_version}
    if uses_autoscaling(graph):
        cluster["enableInTreeAutoscaling"] = True
    cluster["headGroupSpec"] = {
        # Keep Serve replicas off the head: it runs the controller, GCS and dashboard.
        "rayStartParams": {"num-cpus": "0"},
        "template": _head_template(image, options.head),
    }
    cluster["workerGroupSpecs"] = [_worker_group(p, image, options.workers) for p in plans]

    spec: dict[str, Any] = {}
    if options.upgrade_strategy:
        spec["upgradeStrategy"] = {"type": options.upgrade_strategy}
    if options.serve_service is not None:
        spec["serveService"] = dict(options.serve_service)
    if options.suspend is not None:
        spec["suspend"] = options.suspend
    spec["serveConfigV2"] = serve_config_yaml(graph)
    spec["rayClusterConfig"] = cluster

    labels = {**dict(graph.labels), **options.labels, "app.kubernetes.io/managed-by": "servegraph"}
    metadata: dict[str, Any] = {"name": name}
    if options.namespace:
        metadata["namespace"] = options.namespace
    metadata["labels"] = dict(sorted(labels.items()))
    metadata["annotations"] = {SPEC_HASH_ANNOTATION: spec_hash(metadata["labels"], spec)}
    if options.owner_references:
        metadata["ownerReferences"] = [dict(o) for o in options.owner_references]
    return {"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": metadata, "spec": spec}


def spec_hash(labels: Mapping[str, str], spec: Mapping[str, Any]) -> str:
    """sha256 over what servegraph owns; equal hashes mean there is nothing to write."""
    canonical = orjson.dumps({"labels": labels, "spec": spec}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


def _quantity(n_bytes: int) -> str:
    return f"{n_bytes // GiB}Gi" if n_bytes % GiB == 0 else str(n_bytes)


def _cpu(cpus: float) -> str:
    return str(int(cpus)) if float(cpus).is_integer() else f"{int(cpus * 1000)}m"


def _container(
    name: str, image: str, resources: Mapping[str, Any], overrides: PodOverrides, ports: list[dict[str, Any]]
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": image}
    if ports:
        container["ports"] = ports
    container["resources"] = dict(overrides.resources) if overrides.resources is not None else dict(resources)
    if overrides.env:
        container["env"] = [dict(e) for e in overrides.env]
    return container


def _pod_spec(container: dict[str, Any], overrides: PodOverrides, node_selector: Mapping[str, str]) -> dict[str, Any]:
    pod: dict[str, Any] = {}
    if overrides.service_account_name:
        pod["serviceAccountName"] = overrides.service_account_name
    selector = {**node_selector, **overrides.node_selector}
    if selector:
        pod["nodeSelector"] = dict(sorted(selector.items()))
    if overrides.tolerations:
        pod["tolerations"] = [dict(t) for t in overrides.tolerations]
    pod["containers"] = [container]
    return {"spec": pod}


def _head_template(image: str, overrides: PodOverrides) -> dict[str, Any]:
    limits = dict(HEAD_RESOURCES)
    ports = [
        {"containerPort": 6379, "name": "gcs-server"},
        {"containerPort": 8265, "name": "dashboard"},
        {"containerPort": 10001, "name": "client"},
        {"containerPort": SERVE_HTTP_PORT, "name": "serve"},
    ]
    container = _container("ray-head", image, {"requests": limits, "limits": limits}, overrides, ports)
    return _pod_spec(container, overrides, {})


def _worker_group(plan: WorkerGroupPlan, image: str, overrides: PodOverrides) -> dict[str, Any]:
    limits: dict[str, str] = {"cpu": _cpu(plan.cpus), "memory": _quantity(plan.memory_bytes)}
    if plan.gpus:
        limits["nvidia.com/gpu"] = str(plan.gpus)
    start: dict[str, str] = {}
    if plan.custom_resources:
        start["resources"] = json.dumps(dict(plan.custom_resources), sort_keys=True)
    container = _container("ray-worker", image, {"requests": dict(limits), "limits": limits}, overrides, [])
    return {
        "groupName": plan.name,
        "replicas": plan.initial_workers,
        "minReplicas": plan.min_workers,
        "maxReplicas": plan.max_workers,
        "rayStartParams": start,
        "template": _pod_spec(container, overrides, dict(plan.node_selector)),
    }
