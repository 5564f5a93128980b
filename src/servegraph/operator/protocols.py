"""The reconciler's I/O, as protocols: the API server, the registry client and the parser.

The reconcile depends on these and nothing wider, so unit tests drive it with an
in-memory implementation (tests/unit/memory_api.py) and production with
`servegraph.kube.KubeClient`, `servegraph.source.RegistryClient` and
`servegraph.operator.fetch.parsing.GraphParser`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from servegraph.dag.model import Graph
from servegraph.source import Fetched, FetchRequest


class RayServiceApi(Protocol):
    """A RayService: read, server-side apply, delete (the apply and suspend steps)."""

    async def get_rayservice(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def apply_rayservice(self, manifest: Mapping[str, Any], force: bool = True) -> dict[str, Any]: ...

    async def delete_rayservice(self, namespace: str, name: str, uid: str, resource_version: str) -> None: ...


class RouteApi(Protocol):
    """A ServeGraph's HTTPRoute: read, server-side apply, delete (operator/apply/expose.py);
    `servegraph.kube.routes.RouteClient`, and `tests/unit/memory_api.py` in unit tests."""

    async def get_httproute(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def apply_httproute(self, manifest: Mapping[str, Any], force: bool = True) -> dict[str, Any]: ...

    async def delete_httproute(self, namespace: str, name: str, uid: str, resource_version: str) -> None: ...


class ConfigMapApi(Protocol):
    """The rollback store's ConfigMap: read whole, create, merge patch (operator/rollout/store.py)."""

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def create_configmap(self, manifest: Mapping[str, Any]) -> dict[str, Any]: ...

    async def patch_configmap(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]: ...


class ConfigMapKeys(Protocol):
    """One key of a ConfigMap (a download's CA bundle)."""

    async def read_configmap_key(self, namespace: str, name: str, key: str) -> str: ...


class ApiServer(RayServiceApi, ConfigMapApi, ConfigMapKeys, Protocol):
    """What the reconcile needs of the Kubernetes API server, and nothing more: each step's
    own protocol above (one declaration per call), plus writing the status, posting an
    Event and reading a Secret.

    `servegraph.kube.KubeClient` is the real one. Failures raise `KubeError`.
    """

    async def patch_servegraph_status(
        self, namespace: str, name: str, uid: str, status: Mapping[str, Any]
    ) -> dict[str, Any] | None: ...

    async def post_event(
        self, involved: Mapping[str, Any], type_: str, reason: str, message: str, now: str
    ) -> None: ...

    async def read_secret_data(self, namespace: str, name: str) -> dict[str, str]: ...


Fetcher = Callable[[FetchRequest], Awaitable[Fetched]]
"""Downloads a graph (`servegraph.source.RegistryClient.fetch`); raises FetchError."""
Parser = Callable[[bytes, int], Awaitable[Graph]]
"""Decodes and validates (`parsing.GraphParser.parse` in a child process); raises GraphError."""
