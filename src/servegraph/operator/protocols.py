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


class ApiServer(Protocol):
    """What the reconcile needs of the Kubernetes API server, and nothing more:
    apply, write status, post an event, get (a RayService, a Secret, a ConfigMap key),
    the rollback store's ConfigMap, and delete a RayService (spec.suspend).

    `servegraph.kube.KubeClient` is the real one. Failures raise `KubeError`.
    """

    async def get_rayservice(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def apply_rayservice(self, manifest: Mapping[str, Any], force: bool = True) -> dict[str, Any]: ...

    async def delete_rayservice(self, namespace: str, name: str, uid: str, resource_version: str) -> None: ...

    async def patch_servegraph_status(self, namespace: str, name: str, uid: str, status: Mapping[str, Any]) -> None: ...

    async def post_event(
        self, involved: Mapping[str, Any], type_: str, reason: str, message: str, now: str
    ) -> None: ...

    async def read_secret_data(self, namespace: str, name: str) -> dict[str, str]: ...

    async def read_configmap_key(self, namespace: str, name: str, key: str) -> str: ...

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    async def apply_configmap(self, manifest: Mapping[str, Any], force: bool = True) -> dict[str, Any]: ...


Fetcher = Callable[[FetchRequest], Awaitable[Fetched]]
"""Downloads a graph (`servegraph.source.RegistryClient.fetch`); raises FetchError."""
Parser = Callable[[bytes, int], Awaitable[Graph]]
"""Decodes and validates (`parsing.GraphParser.parse` in a child process); raises GraphError."""
