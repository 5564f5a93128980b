"""What a tenant may put into `spec.rayService.serveService` (pure).

KubeRay turns that template into a real Service in the tenant's namespace, and the
CRD keeps its unknown fields, so anything a Service can do would reach the cluster:
`externalIPs` intercepts traffic to any address (CVE-2020-8554), a NodePort opens a
port on every node, a LoadBalancer an address outside the cluster. A graph needs a
ClusterIP Service; the administrator may allow NodePort and LoadBalancer
(`--allow-serve-service-types`). Everything else is refused by name: an allowlist,
so a field Kubernetes adds later is refused until someone decides it is safe.

Annotations too: controllers act on a Service's annotations (`tailscale.com/expose` puts
it on a tailnet, `external-dns.alpha.kubernetes.io/hostname` publishes a DNS name,
`service.cilium.io/global` shares it across clusters), so an annotation is allowed only
under a prefix the administrator lists (`--allow-serve-service-annotations`; none by
default).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

FIELD = "spec.rayService.serveService"
CLUSTER_IP = "ClusterIP"
WIDENING = ("NodePort", "LoadBalancer")
"""The types an administrator may allow besides ClusterIP. Never ExternalName: a DNS
alias to any name is not a serve endpoint."""

_META = {"name", "labels", "annotations"}
_SPEC = {
    "type",
    "ports",
    "sessionAffinity",
    "sessionAffinityConfig",
    "ipFamilies",
    "ipFamilyPolicy",
    "internalTrafficPolicy",
    "trafficDistribution",
    "publishNotReadyAddresses",
}
_NODE_PORT_SPEC = {"externalTrafficPolicy"}
_LOAD_BALANCER_SPEC = {
    "loadBalancerSourceRanges",
    "loadBalancerClass",
    "loadBalancerIP",
    "allocateLoadBalancerNodePorts",
    "healthCheckNodePort",
}
_PORT = {"name", "port", "targetPort", "protocol", "appProtocol"}
_WHY = {
    "externalIPs": "external IPs let a Service take over traffic to any address (CVE-2020-8554)",
    "externalName": "a serve Service is not a DNS alias",
    "clusterIP": "the cluster assigns the Service's address",
    "clusterIPs": "the cluster assigns the Service's address",
    "selector": "KubeRay selects the serving pods itself",
}


def check(
    raw: Any, allowed_types: Collection[str] = (), annotation_prefixes: Collection[str] | None = None
) -> list[str]:
    """Every problem of a serveService template, each naming its field; empty when it is allowed.

    `allowed_types` are the administrator's additions to ClusterIP; `annotation_prefixes`
    the prefixes an annotation's key must start with (None: any, for tools that render what
    a spec says without the operator's flags).
    """
    if not isinstance(raw, Mapping):
        return [f"{FIELD}: must be an object (a Service template)"]
    types = {CLUSTER_IP, *allowed_types}
    problems = [f"{FIELD}.{k}: not allowed" for k in raw if k not in {"apiVersion", "kind", "metadata", "spec"}]
    meta = raw.get("metadata", {})
    if not isinstance(meta, Mapping):
        problems.append(f"{FIELD}.metadata: must be an object")
    else:
        problems += [
            f"{FIELD}.metadata.{k}: not allowed (only name, labels, annotations)" for k in meta if k not in _META
        ]
        if annotation_prefixes is not None:
            problems += _annotations(meta.get("annotations") or {}, annotation_prefixes)
    spec = raw.get("spec", {})
    if not isinstance(spec, Mapping):
        return [*problems, f"{FIELD}.spec: must be an object"]
    kind = spec.get("type", CLUSTER_IP)
    if not isinstance(kind, str) or kind not in types:
        allowed = ", ".join(t for t in (CLUSTER_IP, *WIDENING) if t in types)
        problems.append(
            f"{FIELD}.spec.type: {kind!r} is not allowed (allowed: {allowed}; "
            "the operator's --allow-serve-service-types widens it)"
        )
        kind = CLUSTER_IP  # judge the other fields as the allowed type would be
    fields = set(_SPEC)
    if kind in WIDENING:
        fields |= _NODE_PORT_SPEC
    if kind == "LoadBalancer":
        fields |= _LOAD_BALANCER_SPEC
    for k in spec:
        if k not in fields:
            why = _WHY.get(k) or (f"only with type {_needs(k)}" if _needs(k) else "not needed by a serve Service")
            problems.append(f"{FIELD}.spec.{k}: not allowed ({why})")
    ports = spec.get("ports", [])
    if not isinstance(ports, list):
        return [*problems, f"{FIELD}.spec.ports: must be a list"]
    port_fields = _PORT | ({"nodePort"} if kind in WIDENING else set())
    for i, port in enumerate(ports):
        if not isinstance(port, Mapping):
            problems.append(f"{FIELD}.spec.ports[{i}]: must be an object")
            continue
        for k in port:
            if k not in port_fields:
                why = "only with type NodePort or LoadBalancer" if k == "nodePort" else "not needed by a serve Service"
                problems.append(f"{FIELD}.spec.ports[{i}].{k}: not allowed ({why})")
    return problems


def _annotations(annotations: Any, prefixes: Collection[str]) -> list[str]:
    where = f"{FIELD}.metadata.annotations"
    if not isinstance(annotations, Mapping):
        return [f"{where}: must be an object"]
    allowed = ", ".join(sorted(prefixes)) or "none"
    return [
        f"{where}[{key!r}]: not allowed (controllers act on annotations; the prefixes allowed: {allowed}, "
        "the operator's --allow-serve-service-annotations)"
        for key in annotations
        if not any(str(key).startswith(prefix) for prefix in prefixes)
    ]


_PREFIX = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*")


def parse_annotation_prefixes(text: str) -> tuple[str, ...]:
    """The `--allow-serve-service-annotations` flag: comma-separated prefixes of annotation keys
    (`prometheus.io/`, `example.com/team-`); empty: none. A prefix must name something: an
    empty one would allow every annotation, and `*` is no glob here."""
    prefixes = tuple(sorted({p.strip() for p in text.split(",") if p.strip()}))
    bad = [p for p in prefixes if not _PREFIX.fullmatch(p)]
    if bad:
        raise ValueError(
            f"--allow-serve-service-annotations: {', '.join(map(repr, bad))} is no annotation key prefix "
            "(letters, digits, '.', '_', '/', '-', starting with a letter or digit)"
        )
    return prefixes


def _needs(key: str) -> str:
    if key in _NODE_PORT_SPEC:
        return "NodePort or LoadBalancer"
    return "LoadBalancer" if key in _LOAD_BALANCER_SPEC else ""


def parse_types(text: str) -> frozenset[str]:
    """The `--allow-serve-service-types` flag: comma-separated NodePort and/or LoadBalancer."""
    names = frozenset(t.strip() for t in text.split(",") if t.strip()) - {CLUSTER_IP}
    unknown = sorted(names - set(WIDENING))
    if unknown:
        raise ValueError(
            f"--allow-serve-service-types: {', '.join(unknown)} cannot be allowed (only {', '.join(WIDENING)})"
        )
    return names
