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

from servegraph.names import API_VERSION, GRAPH_LABEL, KIND, Key
from servegraph.operator.apply import serve_service
from servegraph.operator.fetch import secrets
from servegraph.operator.fetch.secrets import SecretKeyRef
from servegraph.operator.rollout.decide import RolloutSpec
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

    def secrets(self) -> frozenset[Key]:
        """(namespace, name) of every Secret a download reads: the ones worth watching."""
        refs = [self.token, self.ca_secret]
        return frozenset(r.secret for r in refs if r is not None)


@dataclass(frozen=True)
class ServeGraphSpec:
    source: Source
    ray_service: Mapping[str, Any]
    rollout: RolloutSpec = field(default_factory=RolloutSpec)
    suspend: bool = False
    """`spec.suspend` (or the deprecated `spec.rayService.suspend`, which KubeRay's RayService
    never had): the RayService is deleted, the ServeGraph and its graphs kept."""

    def rayservice_options(self, name: str, namespace: str, owner: Mapping[str, Any]) -> RayServiceOptions:
        rs = self.ray_service
        return RayServiceOptions(
            name=rs.get("name") or name,
            namespace=namespace,
            labels={GRAPH_LABEL: name},
            image=rs.get("image"),
            ray_version=rs.get("rayVersion"),
            head=_pod(rs.get("head") or {}),
            workers=_workers(rs),
            upgrade_strategy=_strategy(rs),
            autoscaler=_autoscaler(rs.get("autoscaler") or {}),
            serve_service=rs.get("serveService"),
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


def parse_spec(spec: Mapping[str, Any], namespace: str, serve_service_types: Collection[str] = ()) -> ServeGraphSpec:
    """Read the spec of a ServeGraph in `namespace`, where every Secret and ConfigMap it names lives.

    `serve_service_types` are the Service types the administrator allows besides ClusterIP.
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
    ray_service = dict(spec.get("rayService") or {})
    if ray_service.get("serveService") is not None:
        problems = serve_service.check(ray_service["serveService"], serve_service_types)
        if problems:
            raise SpecError("; ".join(problems))
    return ServeGraphSpec(
        source=source,
        ray_service=ray_service,
        rollout=_rollout(spec.get("rollout") or {}),
        suspend=bool(spec.get("suspend") or ray_service.get("suspend")),
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
