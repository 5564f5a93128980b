"""A graph's HTTP routes as a Gateway API HTTPRoute (pure): `spec.expose`.

One HTTPRoute, named as its ServeGraph, attached to the Gateway the ServeGraph names (an
administrator's, on its allowlist), for the hostnames it lists, sends each application's
path to the RayService's serve Service — the one KubeRay keeps pointing at the cluster that
serves, so the route keeps answering across KubeRay's switch to a new cluster. An
application answers at the Gateway on its route prefix, or on a path of its own, rewritten
to the prefix (Ray Serve routes by it): `URLRewrite` with `ReplacePrefixMatch`, an Extended
feature of the Gateway API that Traefik, Envoy Gateway and Istio implement.

The Gateway API allows 16 rules per HTTPRoute and 64 matches per rule: the applications
served on their own prefixes share one rule (one backend), each rewritten one needs its own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from servegraph.dag import model
from servegraph.names import (
    GATEWAY_API_VERSION,
    GATEWAY_GROUP,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    ROUTE_KIND,
    SPEC_HASH_ANNOTATION,
)
from servegraph.render.serve_config import SERVE_HTTP_PORT

MAX_RULES, MAX_MATCHES = 16, 64


class RouteError(ValueError):
    """The routes do not fit one HTTPRoute, or name an application the graph does not have."""


@dataclass(frozen=True)
class RouteOptions:
    name: str
    namespace: str
    gateway_namespace: str
    gateway_name: str
    service: str
    """The serve Service KubeRay keeps on the serving cluster (`<RayService>-serve-svc`)."""
    port: int = SERVE_HTTP_PORT
    section_name: str | None = None
    hostnames: tuple[str, ...] = ()
    paths: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    owner_references: tuple[Mapping[str, Any], ...] = ()


def serve_service(rayservice: str, template: Mapping[str, Any] | None) -> tuple[str, int]:
    """The serve Service KubeRay makes for a RayService and its HTTP port: the template's name and
    `serve` port where `spec.rayService.serveService` sets them, else KubeRay's defaults."""
    meta = (template or {}).get("metadata") or {}
    ports = ((template or {}).get("spec") or {}).get("ports") or ()
    port = next((int(p["port"]) for p in ports if p.get("name") == "serve" and p.get("port")), SERVE_HTTP_PORT)
    return str(meta.get("name") or f"{rayservice}-serve-svc"), port


def routed(graph: model.Graph) -> dict[str, str]:
    """Application → its route prefix, for the applications that answer HTTP."""
    return {a.name: a.route_prefix for a in sorted(graph.applications, key=lambda a: a.name) if a.route_prefix}


def render_httproute(prefixes: Mapping[str, str], options: RouteOptions) -> dict[str, Any]:
    """The HTTPRoute for the applications' route prefixes (`routed(graph)`), with the spec-hash
    annotation over its labels and spec."""
    unknown = sorted(set(options.paths) - set(prefixes))
    if unknown:
        raise RouteError(
            f"spec.expose.applications: {', '.join(unknown)}: no such application with an HTTP route in the graph"
        )
    backend = [{"name": options.service, "port": options.port}]
    plain = [_match(prefix) for app, prefix in sorted(prefixes.items()) if options.paths.get(app, prefix) == prefix]
    rules: list[dict[str, Any]] = []
    for start in range(0, len(plain), MAX_MATCHES):
        rules.append({"matches": plain[start : start + MAX_MATCHES], "backendRefs": backend})
    for app, prefix in sorted(prefixes.items()):
        path = options.paths.get(app, prefix)
        if path != prefix:
            rewrite = {
                "type": "URLRewrite",
                "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": prefix}},
            }
            rules.append({"matches": [_match(path)], "filters": [rewrite], "backendRefs": backend})
    if len(rules) > MAX_RULES:
        raise RouteError(
            f"spec.expose: {len(rules)} rules, over the {MAX_RULES} an HTTPRoute may hold (each application on a path "
            f"other than its route prefix needs its own, the others share one per {MAX_MATCHES})"
        )
    parent: dict[str, Any] = {
        "group": GATEWAY_GROUP,
        "kind": "Gateway",
        "namespace": options.gateway_namespace,
        "name": options.gateway_name,
    }
    if options.section_name:
        parent["sectionName"] = options.section_name
    spec: dict[str, Any] = {"parentRefs": [parent]}
    if options.hostnames:
        spec["hostnames"] = list(options.hostnames)
    spec["rules"] = rules
    labels = dict(sorted({**options.labels, MANAGED_BY_LABEL: MANAGED_BY}.items()))
    metadata: dict[str, Any] = {"name": options.name, "namespace": options.namespace, "labels": labels}
    metadata["annotations"] = {SPEC_HASH_ANNOTATION: route_hash(labels, spec)}
    if options.owner_references:
        metadata["ownerReferences"] = [dict(o) for o in options.owner_references]
    return {"apiVersion": GATEWAY_API_VERSION, "kind": ROUTE_KIND, "metadata": metadata, "spec": spec}


def route_hash(labels: Mapping[str, str], spec: Mapping[str, Any]) -> str:
    text = json.dumps({"labels": labels, "spec": spec}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _match(path: str) -> dict[str, Any]:
    return {"path": {"type": "PathPrefix", "value": path}}


def paths_of(route: Mapping[str, Any]) -> Sequence[str]:
    """The paths an HTTPRoute matches, in order (for messages and `servegraph status`)."""
    rules = (route.get("spec") or {}).get("rules") or ()
    return [str(((m.get("path") or {}).get("value")) or "/") for r in rules for m in r.get("matches") or ()]
