"""The ServeGraph custom resource's spec, read into typed values (pure).

The CRD's schema and CEL rules refuse most bad input before it gets here; this
turns what is left into values the reconcile compares (a changed `Source`
means a new download) and the RayService options the renderer takes.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from servegraph.names import API_VERSION, GRAPH_LABEL, KIND
from servegraph.operator import secrets, serve_service
from servegraph.operator.gateways import GatewayPolicy
from servegraph.operator.secrets import SecretKeyRef
from servegraph.render import PodOverrides, RayServiceOptions
from servegraph.render.rayservice import AutoscalerOptions, UpgradeStrategy

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


class SpecError(ValueError):
    """The spec cannot be used; the message names the field."""


def parse_duration(text: str, field: str) -> float:
    """Seconds from a Go/Kubernetes duration such as "90s", "5m" or "1h30m"."""
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not text or pos != len(text):
        raise SpecError(f"spec.{field}: {text!r} is not a duration like 30s, 5m or 1h30m")
    return total


@dataclass(frozen=True)
class ConfigMapKeyRef:
    """One key of one ConfigMap (a CA bundle), in the ServeGraph's namespace."""

    namespace: str
    name: str
    key: str


@dataclass(frozen=True)
class Source:
    url: str
    token: SecretKeyRef
    allow_insecure_http: bool = False
    ca_secret: SecretKeyRef | None = None
    ca_config_map: ConfigMapKeyRef | None = None
    sha256: str | None = None
    poll_interval_s: float | None = None
    timeout_s: float = 30.0
    max_bytes: int = 16 * 1024 * 1024


@dataclass(frozen=True)
class CanaryStep:
    weight: int
    """Percent of requests the new version answers."""
    pause_s: float = 60.0


@dataclass(frozen=True)
class NodeThreshold:
    """`canary.analysis.nodes[]`: one node's own thresholds (its edge's errors, its p99)."""

    application: str
    node: str
    max_error_rate: float | None = None
    max_latency_ratio: float | None = None


@dataclass(frozen=True)
class Analysis:
    """`canary.analysis`: what must hold at every step. The defaults are what `canary: {}` gets."""

    interval_s: float = 15.0
    min_requests: int = 20
    max_error_rate: float = 0.01
    max_latency_ratio: float = 2.0
    failure_limit: int = 1
    nodes: tuple[NodeThreshold, ...] = ()


DEFAULT_STEPS = (CanaryStep(10, 60.0), CanaryStep(50, 60.0))


@dataclass(frozen=True)
class CanarySpec:
    """`spec.rollout.canary` (rollout/canary.py decides by it)."""

    steps: tuple[CanaryStep, ...] = DEFAULT_STEPS
    analysis: Analysis = field(default_factory=Analysis)
    mirror_percent: int = 0
    mirror_pause_s: float = 60.0
    sticky_header: str | None = None
    sticky_field: str | None = None
    queue_publishes: bool = False
    """onPublish: Queue (the running canary finishes first); default Restart."""


@dataclass(frozen=True)
class RolloutSpec:
    """`spec.rollout` (rollout/decide.py decides by it)."""

    progress_deadline_s: float = 600.0
    auto_rollback: bool = True
    history_limit: int = 10
    pin_digest: str | None = None
    pin_version: str | None = None
    canary: CanarySpec | None = None


@dataclass(frozen=True)
class RayServiceSpec:
    """`spec.rayService`: what the ServeGraph sets of the RayService it renders."""

    name: str | None = None
    """The RayService's name; None: the ServeGraph's."""
    image: str | None = None
    ray_version: str | None = None
    head: PodOverrides = field(default_factory=PodOverrides)
    workers: PodOverrides = field(default_factory=PodOverrides)
    upgrade_strategy: UpgradeStrategy | None = None
    autoscaler: AutoscalerOptions = field(default_factory=AutoscalerOptions)
    serve_service: Mapping[str, Any] | None = None
    cluster_deletion_delay_s: int | None = None
    """`rayClusterDeletionDelaySeconds`; None: KubeRay's default (60 s)."""

    @property
    def strategy(self) -> str | None:
        """KubeRay's upgradeStrategy type, when the spec sets one."""
        return None if self.upgrade_strategy is None else self.upgrade_strategy.type


@dataclass(frozen=True)
class ExposeSpec:
    """`spec.expose`: the graph's HTTP routes through an HTTPRoute on an allowed Gateway."""

    gateway_namespace: str
    gateway_name: str
    section_name: str | None = None
    hostnames: tuple[str, ...] = ()
    paths: Mapping[str, str] = field(default_factory=dict)
    """Application → the path it answers on at the Gateway (default: its route prefix)."""


@dataclass(frozen=True)
class ServeGraphSpec:
    source: Source
    ray_service: RayServiceSpec = field(default_factory=RayServiceSpec)
    rollout: RolloutSpec = field(default_factory=RolloutSpec)
    expose: ExposeSpec | None = None
    suspend: bool = False
    """`spec.suspend` (or the deprecated `spec.rayService.suspend`, which KubeRay's RayService
    never had): the RayService is deleted, the ServeGraph and its graphs kept."""

    def rayservice_options(self, name: str, namespace: str, owner: Mapping[str, Any]) -> RayServiceOptions:
        rs = self.ray_service
        return RayServiceOptions(
            name=rs.name or name,
            namespace=namespace,
            labels={GRAPH_LABEL: name},
            image=rs.image,
            ray_version=rs.ray_version,
            head=rs.head,
            workers=rs.workers,
            upgrade_strategy=rs.upgrade_strategy,
            autoscaler=rs.autoscaler,
            serve_service=rs.serve_service,
            cluster_deletion_delay_s=rs.cluster_deletion_delay_s,
            owner_references=(owner,),
        )


def _strategy(rs: Mapping[str, Any]) -> UpgradeStrategy | None:
    kind = rs.get("upgradeStrategy")
    if not kind:
        return None
    options = rs.get("clusterUpgradeOptions") or {}
    return UpgradeStrategy(
        kind,
        gateway_class_name=options.get("gatewayClassName"),
        max_surge_percent=options.get("maxSurgePercent"),
        step_size_percent=options.get("stepSizePercent"),
        interval_seconds=options.get("intervalSeconds"),
    )


def _autoscaler(raw: Mapping[str, Any]) -> AutoscalerOptions:
    idle = raw.get("idleTimeoutSeconds")
    return AutoscalerOptions(
        idle_timeout_seconds=None if idle is None else int(idle),
        upscaling_mode=raw.get("upscalingMode") or None,
        resources=raw.get("resources") or None,
    )


def _rollout(raw: Mapping[str, Any]) -> RolloutSpec:
    pin = raw.get("pin") or {}
    digest = pin.get("digest") or None
    return RolloutSpec(
        progress_deadline_s=parse_duration(raw.get("progressDeadline") or "10m", "rollout.progressDeadline"),
        auto_rollback=bool(raw.get("autoRollback", True)),
        history_limit=int(raw.get("historyLimit") or 10),
        pin_digest=digest.removeprefix("sha256:") if digest else None,
        pin_version=pin.get("version") or None,
        canary=None if raw.get("canary") is None else _canary(raw["canary"]),
    )


def _canary(raw: Mapping[str, Any]) -> CanarySpec:
    """`spec.rollout.canary`; the CRD's schema and CEL rules refused the rest already."""
    steps = raw.get("steps")
    a = raw.get("analysis") or {}
    mirror = raw.get("mirror") or {}
    sticky = raw.get("stickyKey") or {}
    return CanarySpec(
        steps=DEFAULT_STEPS
        if steps is None
        else tuple(
            CanaryStep(int(s["weight"]), parse_duration(s.get("pause") or "1m", f"rollout.canary.steps[{i}].pause"))
            for i, s in enumerate(steps)
        ),
        analysis=Analysis(
            interval_s=parse_duration(a.get("interval") or "15s", "rollout.canary.analysis.interval"),
            min_requests=int(a.get("minRequests", 20)),
            max_error_rate=float(a.get("maxErrorRate", 0.01)),
            max_latency_ratio=float(a.get("maxLatencyRatio", 2.0)),
            failure_limit=int(a.get("failureLimit", 1)),
            nodes=tuple(
                NodeThreshold(
                    str(n["application"]),
                    str(n["node"]),
                    None if n.get("maxErrorRate") is None else float(n["maxErrorRate"]),
                    None if n.get("maxLatencyRatio") is None else float(n["maxLatencyRatio"]),
                )
                for n in a.get("nodes") or ()
            ),
        ),
        mirror_percent=int(mirror.get("percent") or 0),
        mirror_pause_s=parse_duration(mirror.get("pause") or "1m", "rollout.canary.mirror.pause"),
        sticky_header=sticky.get("header") or None,
        sticky_field=sticky.get("field") or None,
        queue_publishes=raw.get("onPublish") == "Queue",
    )


def pod_overrides(ray_service: Mapping[str, Any]) -> tuple[PodOverrides, PodOverrides]:
    """The head and worker overrides of a `spec.rayService`: what the operator renders with,
    and what `servegraph validate --pods` and `render --pods` plan with."""
    return _pod(ray_service.get("head") or {}), _workers(ray_service)


def _workers(rs: Mapping[str, Any]) -> PodOverrides:
    """`workers`, for every worker group, with `workerGroups` (placement per group name) over it."""
    groups = rs.get("workerGroups") or {}
    return _pod(rs.get("workers") or {}, {name: _pod(p) for name, p in sorted(groups.items())})


def _pod(p: Mapping[str, Any], groups: Mapping[str, PodOverrides] | None = None) -> PodOverrides:
    return PodOverrides(
        service_account_name=p.get("serviceAccountName"),
        node_selector=dict(p.get("nodeSelector") or {}),
        tolerations=tuple(p.get("tolerations") or ()),
        resources=p.get("resources"),
        env=tuple(p.get("env") or ()),
        affinity=p.get("affinity") or None,
        priority_class_name=p.get("priorityClassName") or None,
        groups=dict(groups or {}),
    )


def _config_map_ref(raw: Mapping[str, Any] | None, namespace: str) -> ConfigMapKeyRef | None:
    if not raw:
        return None
    return ConfigMapKeyRef(namespace=namespace, name=str(raw["name"]), key=str(raw.get("key") or "ca.crt"))


def _expose(raw: Mapping[str, Any] | None, namespace: str, gateways: GatewayPolicy | None) -> ExposeSpec | None:
    """`spec.expose`, its Gateway held to the administrator's allowlist (None: not checked)."""
    if raw is None:
        return None
    gateway = raw.get("gateway") or {}
    gw_ns, gw_name = str(gateway.get("namespace") or namespace), str(gateway.get("name") or "")
    problem = None if gateways is None else gateways.gateway_problem(gw_ns, gw_name, "spec.expose.gateway")
    if problem is not None:
        raise SpecError(problem)
    apps = raw.get("applications") or {}
    return ExposeSpec(
        gateway_namespace=gw_ns,
        gateway_name=gw_name,
        section_name=gateway.get("sectionName") or None,
        hostnames=tuple(raw.get("hostnames") or ()),
        paths={str(app): str(v["path"]) for app, v in sorted(apps.items()) if (v or {}).get("path")},
    )


def parse_spec(
    spec: Mapping[str, Any],
    namespace: str,
    serve_service_types: Collection[str] = (),
    serve_service_annotations: Collection[str] | None = None,
    gateways: GatewayPolicy | None = None,
) -> ServeGraphSpec:
    """Read the spec of a ServeGraph in `namespace`, where every Secret and ConfigMap it names lives.

    `serve_service_types` are the Service types the administrator allows besides ClusterIP;
    `serve_service_annotations` the annotation key prefixes (None: not checked); `gateways` the
    Gateways and gateway classes (None: not checked; the operator's default allows none).
    """
    src = spec.get("source") or {}
    if not src.get("url") or not src.get("tokenSecretRef", {}).get("name"):
        raise SpecError("spec.source: url and tokenSecretRef.name are required")
    ca = src.get("caBundle") or {}
    token = secrets.from_spec(src["tokenSecretRef"], namespace, "token")
    assert token is not None
    poll = src.get("pollInterval")
    source = Source(
        url=str(src["url"]),
        token=token,
        allow_insecure_http=bool(src.get("allowInsecureHTTP", False)),
        ca_secret=secrets.from_spec(ca.get("secretRef"), namespace, "ca.crt"),
        ca_config_map=_config_map_ref(ca.get("configMapRef"), namespace),
        sha256=(src.get("sha256") or None),
        poll_interval_s=parse_duration(poll, "source.pollInterval") if poll else None,
        timeout_s=parse_duration(src.get("timeout") or "30s", "source.timeout"),
        max_bytes=int(src.get("maxBytes") or 16 * 1024 * 1024),
    )
    raw = spec.get("rayService") or {}
    if raw.get("serveService") is not None:
        problems = serve_service.check(raw["serveService"], serve_service_types, serve_service_annotations)
        if problems:
            raise SpecError("; ".join(problems))
    head, workers = pod_overrides(raw)
    gateway_class = (raw.get("clusterUpgradeOptions") or {}).get("gatewayClassName")
    if gateway_class is not None and gateways is not None:
        problem = gateways.class_problem(str(gateway_class), "spec.rayService.clusterUpgradeOptions.gatewayClassName")
        if problem is not None:
            raise SpecError(problem)
    delay = raw.get("rayClusterDeletionDelaySeconds")
    ray_service = RayServiceSpec(
        name=raw.get("name") or None,
        image=raw.get("image"),
        ray_version=raw.get("rayVersion"),
        head=head,
        workers=workers,
        upgrade_strategy=_strategy(raw),
        autoscaler=_autoscaler(raw.get("autoscaler") or {}),
        serve_service=raw.get("serveService"),
        cluster_deletion_delay_s=None if delay is None else int(delay),
    )
    return ServeGraphSpec(
        source=source,
        ray_service=ray_service,
        rollout=_rollout(spec.get("rollout") or {}),
        expose=_expose(spec.get("expose"), namespace, gateways),
        suspend=bool(spec.get("suspend") or raw.get("suspend")),
    )


def owner_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    """The RayService's owner reference: deleting the ServeGraph deletes it (GC)."""
    meta = body["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
