"""What the installed KubeRay takes, read from its RayService CRD (a schema probe; pure).

A version string (an image tag, a Helm chart's appVersion) says what someone meant to
install; the CRD the API server serves is what every RayService is checked against, and a
field it does not declare is pruned without a word. So the operator reads
`customresourcedefinitions/rayservices.ray.io` and asks this module what it offers:

| feature | in the CRD | KubeRay |
|---|---|---|
| `suspend` | RayService `spec.suspend` | 1.7 |
| `ingress_options` | `rayClusterConfig.headGroupSpec.ingressOptions` | 1.7 |
| `incremental_upgrade` | `upgradeStrategy.clusterUpgradeOptions` (the type is a free string) | 1.5 |

Whether the incremental upgrade *runs* is KubeRay's `RayServiceIncrementalUpgrade`
feature gate, a flag of its operator that no API shows. Alpha and off in 1.5 and 1.6, Beta
and on by default in 1.7 (ray-operator/pkg/features/features.go:109 at v1.7.0): a 1.6
KubeRay with the gate off accepts the type and then never upgrades the cluster at all
(`isZeroDowntimeUpgradeEnabled` returns false for it, rayservice_controller.go:652 at
v1.6.2). The schema only tells the release apart: `spec.suspend` arrived in 1.7, the release
that turned the gate on, so `incremental_upgrade_by_default` is what an admin who left the
gate alone gets; one who set it either way says so in servegraph's configuration.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

RAYSERVICE_CRD = "rayservices.ray.io"
INCREMENTAL = "NewClusterWithIncrementalUpgrade"


class NotARayServiceCRD(ValueError):
    """The object is not KubeRay's RayService CRD, or it serves no `ray.io/v1`."""


@dataclass(frozen=True)
class KubeRayFeatures:
    """What the RayService CRD declares; `KubeRayFeatures.from_crd(crd)`."""

    suspend: bool
    ingress_options: bool
    incremental_upgrade: bool
    incremental_upgrade_by_default: bool

    @classmethod
    def from_crd(cls, crd: Mapping[str, Any]) -> KubeRayFeatures:
        spec = _v1_spec_schema(crd)
        props = spec.get("properties") or {}
        strategy = _at(props, "upgradeStrategy").get("properties") or {}
        head = _at(_at(_at(props, "rayClusterConfig").get("properties") or {}, "headGroupSpec"), "properties")
        suspend = _at(props, "suspend").get("type") == "boolean"
        return cls(
            suspend=suspend,
            ingress_options="ingressOptions" in head,
            incremental_upgrade="clusterUpgradeOptions" in strategy,
            incremental_upgrade_by_default=suspend,
        )

    def describe(self) -> str:
        """One line for the operator's log: what it will use."""
        return (
            f"spec.suspend {'yes' if self.suspend else 'no'}, ingressOptions {'yes' if self.ingress_options else 'no'}, "
            f"NewClusterWithIncrementalUpgrade {'yes' if self.incremental_upgrade else 'no'}"
            + (" (its feature gate on by default)" if self.incremental_upgrade_by_default else "")
        )

    def refusals(self, *, suspend: bool = False, incremental_upgrade: bool = False) -> list[str]:
        """Why the wanted features cannot run on this KubeRay, one sentence each (none: all can)."""
        out = []
        if suspend and not self.suspend:
            out.append("the installed KubeRay's RayService has no spec.suspend (KubeRay 1.7 or later)")
        if incremental_upgrade and not self.incremental_upgrade:
            out.append(f"the installed KubeRay's RayService does not offer {INCREMENTAL} (KubeRay 1.5 or later)")
        return out


def _v1_spec_schema(crd: Mapping[str, Any]) -> Mapping[str, Any]:
    name = (crd.get("metadata") or {}).get("name")
    if crd.get("kind") != "CustomResourceDefinition" or name != RAYSERVICE_CRD:
        raise NotARayServiceCRD(f"expected the CustomResourceDefinition {RAYSERVICE_CRD}, got {crd.get('kind')} {name}")
    for version in (crd.get("spec") or {}).get("versions") or []:
        if version.get("name") == "v1" and version.get("served", True):
            schema = (version.get("schema") or {}).get("openAPIV3Schema") or {}
            return _at(schema.get("properties") or {}, "spec")
    raise NotARayServiceCRD(f"{RAYSERVICE_CRD} serves no version v1")


def _at(props: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = props.get(key)
    return value if isinstance(value, Mapping) else {}
