"""One CustomResourceDefinition read by name: the installed KubeRay's RayService CRD, once at start.

What a KubeRay release offers is what its CRD declares (render/kuberay_features.py), so the
operator reads `customresourcedefinitions/rayservices.ray.io` and nothing else of the kind:
its RBAC names that one object (`get`, `resourceNames`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from servegraph.kube.client import KubeClient


async def get_crd(kube: KubeClient, name: str) -> dict[str, Any] | None:
    """The CRD of that name; None when it is not installed. Other failures raise `KubeError`
    (Forbidden where the operator's RBAC does not name it: single-namespace mode)."""
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{quote(name)}"
    return await kube._get(path, f"get CustomResourceDefinition {name}")
