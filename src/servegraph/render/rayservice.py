"""DAG + overrides → a KubeRay RayService (ray.io/v1) manifest.

Pure: the operator and `servegraph render` call the same function with the same
inputs and get the same dict, including the spec-hash annotation the operator
compares against the live object to skip needless writes.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from servegraph import __version__
from servegraph.dag import model
from servegraph.gcpause import gc_paused
from servegraph.graph.errors import GraphError, Problem
from servegraph.graph.workers import GiB, PodShape, WorkerGroupPlan, plan_worker_groups, uses_autoscaling
from servegraph.names import (
    GRPC_SERVICERS_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    RAY_API_VERSION,
    RAY_KIND,
    RESTARTED_AT_ANNOTATION,
    SPEC_HASH_ANNOTATION,
)
from servegraph.render.scheduling import pod_placement
from servegraph.render.serve_config import SERVE_GRPC_PORT, SERVE_HTTP_PORT, grpc_servicer_functions, serve_config_yaml
from servegraph.render.upgrade import parse_quantity, stable_worker_groups
from servegraph.runtime.payload import Limits

DEFAULT_RAY_VERSION = "2.60.0"
INCREMENTAL = "NewClusterWithIncrementalUpgrade"
# Ray with the servegraph runtime installed (docker/ray.Dockerfile): the plain
# rayproject/ray image cannot import servegraph.runtime:build. GPU graphs get
# the image built on Ray's CUDA base.
DEFAULT_IMAGE = f"ghcr.io/servegraph/servegraph-ray:{__version__}"
MAX_NAME = 47  # KubeRay rejects longer RayService names (derived object names must fit 63).
HEAD_RESOURCES = {"cpu": "2", "memory": "8Gi"}
# KubeRay's own default (500m/512Mi requested) does not fit beside a small head on a small node.
AUTOSCALER_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "500m", "memory": "512Mi"}}

GRPC_MAX_MESSAGE_ENV = "RAY_SERVE_GRPC_MAX_MESSAGE_SIZE"
RAY_ENV = ({"name": GRPC_MAX_MESSAGE_ENV, "value": str(Limits().max_bytes)},)
"""Every Ray container's environment before the ServeGraph's own (which may replace it): Ray
Serve's gRPC proxies, on every node, refuse a message over the ingress's request limit
(RESOURCE_EXHAUSTED) instead of Ray's 2 GiB default; read by Ray only from its environment."""

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class PodOverrides:
    """What a ServeGraph may change in the generated head or worker pods."""

    service_account_name: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    resources: Mapping[str, Any] | None = None
    env: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] | None = None
    priority_class_name: str | None = None
    groups: Mapping[str, PodOverrides] = field(default_factory=dict)
    """Placement (node selector, tolerations, affinity, priority class) per worker group
    name, over this one's (render.placement); a name the graph has no group for is unused."""


@dataclass(frozen=True)
class UpgradeStrategy:
    """KubeRay's spec.upgradeStrategy. The incremental type needs KubeRay's
    RayServiceIncrementalUpgrade feature gate, the in-tree autoscaler (turned on for it)
    and these options; the CRD's CEL rules require them together."""

    type: str
    gateway_class_name: str | None = None
    max_surge_percent: int | None = None
    step_size_percent: int | None = None
    interval_seconds: int | None = None

    @property
    def incremental(self) -> bool:
        return self.type == INCREMENTAL

    def render(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.incremental:
            options = {
                "gatewayClassName": self.gateway_class_name,
                "maxSurgePercent": self.max_surge_percent,
                "stepSizePercent": self.step_size_percent,
                "intervalSeconds": self.interval_seconds,
            }
            out["clusterUpgradeOptions"] = {k: v for k, v in options.items() if v is not None}
        return out


@dataclass(frozen=True)
class AutoscalerOptions:
    """KubeRay's autoscaler sidecar (`autoscalerOptions`), rendered whenever in-tree
    autoscaling is on. Its image is always the head's: the sidecar runs `ray
    kuberay-autoscaler`, so it must be the Ray (and version) the cluster runs."""

    idle_timeout_seconds: int | None = None
    """How long a worker pod stays idle before the autoscaler removes it (KubeRay: 60 s)."""
    upscaling_mode: str | None = None
    """Default, Aggressive or Conservative (how many pods one step may add)."""
    resources: Mapping[str, Any] | None = None
    """Over AUTOSCALER_RESOURCES per resource name, as for the pods."""

    def render(self, image: str) -> dict[str, Any]:
        out: dict[str, Any] = {"image": image}
        if self.idle_timeout_seconds is not None:
            out["idleTimeoutSeconds"] = self.idle_timeout_seconds
        if self.upscaling_mode is not None:
            out["upscalingMode"] = self.upscaling_mode
        out["resources"] = _merged_resources(AUTOSCALER_RESOURCES, self.resources)
        return out


@dataclass(frozen=True)
class RayServiceOptions:
    name: str
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    image: str | None = None
    ray_version: str | None = None
    head: PodOverrides = PodOverrides()
    workers: PodOverrides = PodOverrides()
    upgrade_strategy: UpgradeStrategy | str | None = None
    autoscaler: AutoscalerOptions = AutoscalerOptions()
    """Used only where the in-tree autoscaler is on (a node autoscales, or an incremental upgrade)."""
    serve_service: Mapping[str, Any] | None = None
    cluster_deletion_delay_s: int | None = None
    """KubeRay's `rayClusterDeletionDelaySeconds` (in 1.6 and 1.7 alike); None leaves its default."""
    restarted_at: str | None = None
    """The ServeGraph's restart annotation, rendered into every pod template's annotations:
    a new value changes KubeRay's cluster hash, so it builds a new cluster and moves traffic."""
    owner_references: tuple[Mapping[str, Any], ...] = ()
    previous_cluster: Mapping[str, Any] | None = None
    """The running RayService's rayClusterConfig: worker groups keep its order (see
    upgrade.stable_worker_groups), so a graph change does not force a new cluster."""
    suspend: bool = False
    """KubeRay's own `spec.suspend` (KubeRay 1.7): it deletes the Ray clusters and keeps the
    RayService. Rendered only when true, so a KubeRay without the field never sees it."""
    serve_config: str | None = None
    """The serveConfigV2 text, when it is not the graph's own: a canary's layout of several
    versions (render/canary.py), the graph then being what the cluster must hold."""
    canary_ready: bool = False
    """The graph's own Serve config written ready for a canary (`canary_plan.ready`)."""


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


@gc_paused
def render_rayservice(graph: model.Graph, options: RayServiceOptions) -> dict[str, Any]:
    """The RayService manifest, with a spec-hash annotation over everything we own."""
    name = rayservice_name(options.name)
    plans = plan_worker_groups(graph, worker_pod_shape(options.workers.resources))
    # Without an image given, GPU groups get the CUDA variant and the rest the plain one:
    # adding a GPU node then leaves the head and CPU groups (and the cluster) as they are.
    chosen = options.image or graph.cluster.image
    ray_version = options.ray_version or graph.cluster.ray_version or DEFAULT_RAY_VERSION
    strategy = options.upgrade_strategy
    if isinstance(strategy, str):
        strategy = UpgradeStrategy(strategy)
    cluster: dict[str, Any] = {"rayVersion": ray_version}
    head_image = chosen or DEFAULT_IMAGE
    if uses_autoscaling(graph) or (strategy is not None and strategy.incremental):
        cluster["enableInTreeAutoscaling"] = True
        cluster["autoscalerOptions"] = options.autoscaler.render(head_image)
    cluster["headGroupSpec"] = {
        # Keep Serve replicas off the head: it runs the controller, GCS and dashboard.
        "rayStartParams": {"num-cpus": "0"},
        "template": _head_template(head_image, options.head),
    }
    cluster["workerGroupSpecs"] = [
        _worker_group(p, chosen or (DEFAULT_IMAGE + "-gpu" if p.gpus else DEFAULT_IMAGE), options.workers)
        for p in plans
    ]
    if strategy is not None and strategy.incremental:
        # KubeRay starts an incremental upgrade's new cluster with no `replicas`, so it begins at
        # `minReplicas` and the autoscaler adds workers as Ray Serve's `target_capacity` rises;
        # the old cluster sheds them as its capacity falls (rayservice_controller.go:1523 at
        # v1.7.0). At the full count, each cluster held every worker throughout: the pods
        # doubled. The Serve replicas hold the workers they need at every capacity.
        for group in cluster["workerGroupSpecs"]:
            group["minReplicas"] = 0
    # On every head, not only when applications name servicers: server-side apply leaves
    # `template.metadata: null` (refused by the CRD's schema) when the last annotation in
    # it stops being applied, as dropping it for a graph without servicers did.
    digest = hashlib.sha256("\n".join(grpc_servicer_functions(graph)).encode()).hexdigest()[:16]
    _annotate_pods(cluster, {GRPC_SERVICERS_ANNOTATION: digest}, head_only=True)
    if options.restarted_at:  # before the stable order: a restart starts clean, without parked groups
        _annotate_pods(cluster, {RESTARTED_AT_ANNOTATION: options.restarted_at})
    if options.previous_cluster:
        cluster["workerGroupSpecs"] = stable_worker_groups(options.previous_cluster, cluster)

    spec: dict[str, Any] = {}
    if strategy is not None:
        spec["upgradeStrategy"] = strategy.render()
    if options.serve_service is not None:
        spec["serveService"] = dict(options.serve_service)
    if options.cluster_deletion_delay_s is not None:
        spec["rayClusterDeletionDelaySeconds"] = options.cluster_deletion_delay_s
    if options.suspend:
        spec["suspend"] = True
    spec["serveConfigV2"] = options.serve_config or serve_config_yaml(graph, ready=options.canary_ready)
    spec["rayClusterConfig"] = cluster

    labels = {**dict(graph.labels), **options.labels, MANAGED_BY_LABEL: MANAGED_BY}
    metadata: dict[str, Any] = {"name": name}
    if options.namespace:
        metadata["namespace"] = options.namespace
    metadata["labels"] = dict(sorted(labels.items()))
    metadata["annotations"] = {SPEC_HASH_ANNOTATION: spec_hash(metadata["labels"], spec)}
    if options.owner_references:
        metadata["ownerReferences"] = [dict(o) for o in options.owner_references]
    return {"apiVersion": RAY_API_VERSION, "kind": RAY_KIND, "metadata": metadata, "spec": spec}


def worker_pod_shape(resources: Mapping[str, Any] | None) -> PodShape:
    """What Ray will be told each worker pod has, where the overrides fix it.

    Mirrors KubeRay's `ray start` flags: `--num-cpus` is the container's CPU limit, else its
    request, rounded up to a whole CPU (so "500m" is 1 to Ray); `--memory` the memory limit;
    `--num-gpus` the `nvidia.com/gpu` limit. A memory request without a limit leaves Ray to
    find the node's memory, which cannot be known here: the request is planned with.
    Raises GraphError when a value is not a Kubernetes quantity.
    """
    if not resources:
        return PodShape()
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}

    def amount(key: str) -> float | None:
        """The limit, else the request; zero counts as unset, as KubeRay's `IsZero` checks do."""
        for values in (limits, requests):
            if values.get(key) is None:
                continue
            try:
                number = parse_quantity(values[key])
            except ValueError as exc:
                raise GraphError([Problem("spec.rayService.workers.resources", str(exc))]) from None
            if not math.isfinite(number):
                raise GraphError([Problem("spec.rayService.workers.resources", f"{key} {values[key]!r} is too large")])
            if number:
                return number
        return None

    cpus, memory, gpus = amount("cpu"), amount("memory"), amount("nvidia.com/gpu")
    return PodShape(
        cpus=None if cpus is None else float(math.ceil(cpus)),
        gpus=None if gpus is None else math.ceil(gpus),
        memory_bytes=None if memory is None else int(memory),
    )


def _annotate_pods(cluster: dict[str, Any], annotations: Mapping[str, str], head_only: bool = False) -> None:
    """Add `annotations` to the head's and (unless `head_only`) every worker group's pod template metadata."""
    for group in [cluster["headGroupSpec"], *([] if head_only else cluster["workerGroupSpecs"])]:
        metadata = group["template"].setdefault("metadata", {})
        metadata["annotations"] = {**(metadata.get("annotations") or {}), **annotations}


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
    container["resources"] = _merged_resources(resources, overrides.resources)
    own = [dict(e) for e in overrides.env]
    named = {e.get("name") for e in own}
    container["env"] = [e for e in RAY_ENV if e["name"] not in named] + own
    return container


def _merged_resources(planned: Mapping[str, Any], override: Mapping[str, Any] | None) -> dict[str, Any]:
    """The plan's requests and limits, with each resource the override names taken from it.

    Per resource name, the override wins entirely (its request and its limit; one it
    leaves out defaults as Kubernetes defaults it), and resources it does not name keep
    the plan's values: shrinking cpu and memory can never silently drop a GPU group's
    nvidia.com/gpu, nor leave a planned request above an overridden limit.
    """
    override = override or {}
    named = {key for values in override.values() for key in values}
    out: dict[str, Any] = {}
    for kind in dict.fromkeys([*planned, *override]):
        values = {k: v for k, v in (planned.get(kind) or {}).items() if k not in named}
        values.update(override.get(kind) or {})
        if values:
            out[kind] = values
    return out


def _pod_spec(
    container: dict[str, Any],
    overrides: PodOverrides,
    node_selector: Mapping[str, str],
    hint: model.Placement | None = None,
    group: PodOverrides | None = None,
) -> dict[str, Any]:
    pod: dict[str, Any] = {}
    if overrides.service_account_name:
        pod["serviceAccountName"] = overrides.service_account_name
    pod.update(pod_placement(node_selector, hint, (overrides, group)))
    pod["containers"] = [container]
    return {"spec": pod}


def _head_template(image: str, overrides: PodOverrides) -> dict[str, Any]:
    limits = dict(HEAD_RESOURCES)
    ports = [
        {"containerPort": 6379, "name": "gcs-server"},
        {"containerPort": 8265, "name": "dashboard"},
        {"containerPort": 10001, "name": "client"},
        {"containerPort": SERVE_HTTP_PORT, "name": "serve"},
        # KubeRay (v1.6+) adds every `serve-*` port of the head container to the serve
        # Service, which then reaches Serve's gRPC proxy on the head and the workers.
        {"containerPort": SERVE_GRPC_PORT, "name": "serve-grpc"},
    ]
    container = _container("ray-head", image, {"requests": limits, "limits": limits}, overrides, ports)
    return _pod_spec(container, overrides, {})


def _worker_group(plan: WorkerGroupPlan, image: str, overrides: PodOverrides) -> dict[str, Any]:
    limits: dict[str, str] = {"cpu": _cpu(plan.cpus), "memory": _quantity(plan.memory_bytes)}
    if plan.gpus:
        limits["nvidia.com/gpu"] = str(plan.gpus)
    start: dict[str, str] = {}
    if plan.custom_resources:
        # KubeRay pastes each parameter into a bash command line (`--resources=VALUE`):
        # unquoted, the JSON's braces and spaces would be split by the shell. The amounts are
        # whole (the plan rounds them up) and written as integers: Ray's autoscaler refuses
        # any other number there (`assert isinstance(value, int)`, kuberay/autoscaling_config.py)
        # and its container crashes, which keeps the head pod unready.
        amounts = {name: int(amount) for name, amount in plan.custom_resources}
        start["resources"] = shlex.quote(json.dumps(amounts, sort_keys=True))
    container = _container("ray-worker", image, {"requests": dict(limits), "limits": limits}, overrides, [])
    return {
        "groupName": plan.name,
        "replicas": plan.initial_workers,
        "minReplicas": plan.min_workers,
        "maxReplicas": plan.max_workers,
        "rayStartParams": start,
        "template": _pod_spec(
            container, overrides, dict(plan.node_selector), plan.placement, overrides.groups.get(plan.name)
        ),
    }
