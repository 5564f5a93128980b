"""The ServeGraph custom resource's spec, read into typed values (pure)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from servegraph.render import PodOverrides, RayServiceOptions

GROUP = "servegraph.io"
VERSION = "v1alpha1"
PLURAL = "servegraphs"
KIND = "ServeGraph"
REFRESH_ANNOTATION = "servegraph.io/refresh"
GRAPH_LABEL = "servegraph.io/graph"

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
class Ref:
    name: str
    key: str


@dataclass(frozen=True)
class Source:
    url: str
    token: Ref
    allow_insecure_http: bool = False
    ca_secret: Ref | None = None
    ca_config_map: Ref | None = None
    sha256: str | None = None
    poll_interval_s: float | None = None
    timeout_s: float = 30.0
    max_bytes: int = 16 * 1024 * 1024


@dataclass(frozen=True)
class ServeGraphSpec:
    source: Source
    ray_service: Mapping[str, Any]

    def rayservice_options(self, name: str, namespace: str, owner: Mapping[str, Any]) -> RayServiceOptions:
        rs = self.ray_service
        return RayServiceOptions(
            name=rs.get("name") or name,
            namespace=namespace,
            labels={GRAPH_LABEL: name},
            image=rs.get("image"),
            ray_version=rs.get("rayVersion"),
            head=_pod(rs.get("head") or {}),
            workers=_pod(rs.get("workers") or {}),
            upgrade_strategy=rs.get("upgradeStrategy"),
            serve_service=rs.get("serveService"),
            suspend=rs.get("suspend"),
            owner_references=(owner,),
        )


def _pod(p: Mapping[str, Any]) -> PodOverrides:
    return PodOverrides(
        service_account_name=p.get("serviceAccountName"),
        node_selector=dict(p.get("nodeSelector") or {}),
        tolerations=tuple(p.get("tolerations") or ()),
        resources=p.get("resources"),
        env=tuple(p.get("env") or ()),
    )


def _ref(raw: Mapping[str, Any] | None, default_key: str) -> Ref | None:
    if not raw:
        return None
    return Ref(name=str(raw["name"]), key=str(raw.get("key") or default_key))


def parse_spec(spec: Mapping[str, Any]) -> ServeGraphSpec:
    """Read the spec; the CRD's schema and CEL rules already refused most bad input."""
    src = spec.get("source") or {}
    if not src.get("url") or not src.get("tokenSecretRef", {}).get("name"):
        raise SpecError("spec.source: url and tokenSecretRef.name are required")
    ca = src.get("caBundle") or {}
    token = _ref(src["tokenSecretRef"], "token")
    assert token is not None
    poll = src.get("pollInterval")
    source = Source(
        url=str(src["url"]),
        token=token,
        allow_insecure_http=bool(src.get("allowInsecureHTTP", False)),
        ca_secret=_ref(ca.get("secretRef"), "ca.crt"),
        ca_config_map=_ref(ca.get("configMapRef"), "ca.crt"),
        sha256=(src.get("sha256") or None),
        poll_interval_s=parse_duration(poll, "source.pollInterval") if poll else None,
        timeout_s=parse_duration(src.get("timeout") or "30s", "source.timeout"),
        max_bytes=int(src.get("maxBytes") or 16 * 1024 * 1024),
    )
    return ServeGraphSpec(source=source, ray_service=dict(spec.get("rayService") or {}))


def owner_reference(body: Mapping[str, Any]) -> dict[str, Any]:
    """The RayService's owner reference: deleting the ServeGraph deletes it (GC)."""
    meta = body["metadata"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
