"""The HTTPRoutes ServeGraphs expose their graphs through (`spec.expose`): read, server-side
apply, delete with preconditions. Decides nothing (operator/apply/expose.py does).

The same promises as `KubeClient`'s, on its session: a timeout per call, every failure a
`KubeError`, no write once `may_write` says no.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from servegraph.kube.client import APPLY, KubeClient, KubeError, _applying
from servegraph.names import GATEWAY_GROUP, GATEWAY_VERSION, ROUTE_PLURAL


def _path(namespace: str, name: str) -> str:
    return f"/apis/{GATEWAY_GROUP}/{GATEWAY_VERSION}/namespaces/{quote(namespace)}/{ROUTE_PLURAL}/{quote(name)}"


class RouteClient:
    """Implements `operator.protocols.RouteApi` on a `KubeClient`'s connection."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube

    async def get_httproute(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self.kube._get(_path(namespace, name), f"get HTTPRoute {namespace}/{name}")

    async def apply_httproute(self, manifest: Mapping[str, Any], force: bool = True) -> dict[str, Any]:
        """Server-side apply; a `metadata.resourceVersion` in it makes the write conditional (409)."""
        meta = manifest["metadata"]
        what = f"apply HTTPRoute {meta['namespace']}/{meta['name']}"
        self.kube._fence(what)
        route: dict[str, Any] = await self.kube._call(
            "PATCH", _path(meta["namespace"], meta["name"]), what, manifest, APPLY, _applying(force)
        )
        return route

    async def delete_httproute(self, namespace: str, name: str, uid: str, resource_version: str) -> None:
        """Delete only the object as read (uid and resourceVersion preconditions: 409 otherwise)."""
        what = f"delete HTTPRoute {namespace}/{name}"
        self.kube._fence(what)
        body = {"preconditions": {"uid": uid, "resourceVersion": resource_version}}
        try:
            await self.kube._call("DELETE", _path(namespace, name), what, body, decode=False)
        except KubeError as exc:
            if exc.status != 404:
                raise
