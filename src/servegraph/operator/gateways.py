"""Which Gateways a tenant's ServeGraph may use: the administrator's allowlist (pure).

Two ways a ServeGraph reaches a Gateway, and each is a way out of the cluster:

- `spec.expose.gateway` attaches the graph's HTTPRoute to a Gateway someone runs: its
  listeners decide who can reach the graph (an internet-facing one, a partner network).
- `spec.rayService.clusterUpgradeOptions.gatewayClassName` makes KubeRay *create* a Gateway
  of that class for the incremental upgrade: with Istio or a cloud's class, a LoadBalancer
  with an address outside the cluster — around `--allow-serve-service-types`.

So both are refused unless the administrator allows them by name: `--allow-gateways`
(`namespace/name`, or `namespace/*` for every Gateway of a namespace set aside for it) and
`--allow-gateway-classes`. None by default. The admission policy (config/policy) holds the
same lists for tenants who write RayServices themselves; the Gateway's own listeners
(`allowedRoutes`) still decide which namespaces may attach routes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
WILDCARD = "*"


class GatewayFlagError(ValueError):
    """A flag's entry is not a name (or `namespace/name`); the message names it."""


@dataclass(frozen=True)
class GatewayPolicy:
    """`--allow-gateway-classes` and `--allow-gateways`."""

    classes: frozenset[str] = frozenset()
    gateways: frozenset[tuple[str, str]] = frozenset()
    """(namespace, name); name `*`: every Gateway of the namespace."""

    def allows_gateway(self, namespace: str, name: str) -> bool:
        return (namespace, name) in self.gateways or (namespace, WILDCARD) in self.gateways

    def class_problem(self, name: str, field: str) -> str | None:
        if name in self.classes:
            return None
        allowed = ", ".join(sorted(self.classes)) or "none"
        return (
            f"{field}: gateway class {name!r} is not allowed (allowed: {allowed}; the operator's "
            "--allow-gateway-classes): KubeRay would create a Gateway of that class"
        )

    def gateway_problem(self, namespace: str, name: str, field: str) -> str | None:
        if self.allows_gateway(namespace, name):
            return None
        allowed = ", ".join(f"{ns}/{n}" for ns, n in sorted(self.gateways)) or "none"
        return (
            f"{field}: Gateway {namespace}/{name} is not allowed (allowed: {allowed}; the operator's --allow-gateways)"
        )

    def describe(self) -> str:
        classes = ", ".join(sorted(self.classes)) or "none"
        gateways = ", ".join(f"{ns}/{n}" for ns, n in sorted(self.gateways)) or "none"
        return f"gateway classes {classes}; Gateways {gateways}"


def parse_classes(text: str) -> frozenset[str]:
    """`--allow-gateway-classes`: comma-separated GatewayClass names."""
    names = _entries(text)
    bad = [n for n in names if not _NAME.match(n) or len(n) > 253]
    if bad:
        raise GatewayFlagError(f"--allow-gateway-classes: {', '.join(bad)} is not a GatewayClass name")
    return frozenset(names)


def parse_gateways(text: str) -> frozenset[tuple[str, str]]:
    """`--allow-gateways`: comma-separated `namespace/name` (or `namespace/*`)."""
    out = set()
    for entry in _entries(text):
        namespace, _, name = entry.partition("/")
        if not _NAME.match(namespace) or len(namespace) > 63 or not (name == WILDCARD or _NAME.match(name)):
            raise GatewayFlagError(f"--allow-gateways: {entry!r} is not namespace/name (or namespace/*)")
        out.add((namespace, name))
    return frozenset(out)


def _entries(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def policy(classes: Iterable[str] = (), gateways: Iterable[tuple[str, str]] = ()) -> GatewayPolicy:
    return GatewayPolicy(frozenset(classes), frozenset(gateways))
