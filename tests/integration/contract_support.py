"""The two API servers test_api_contract.py holds to one scenario suite: the unit tests'
stand-in (tests/unit/memory_api.py) and the real kube-apiserver through `KubeClient`.

Each backend is the operator's `ApiServer` (acting as the operator's field manager) plus
what the scenarios need of the rest of the world: another field manager's apply, a merge
patch by hand or by KubeRay (to the status subresource), and ServeGraphs to write the
status of.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path as FilePath
from typing import Any, Protocol

from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from servegraph.kube import KubeClient, KubeError
from servegraph.names import GROUP, PLURAL, RAY_GROUP, RAY_PLURAL, RAY_VERSION, VERSION

UNIT = str(FilePath(__file__).resolve().parents[1] / "unit")
if UNIT not in sys.path:  # the stand-in lives with the unit tests that use it, importing its siblings by name
    sys.path.append(UNIT)

from memory_api import MemoryApiServer  # noqa: E402
from memory_fields import FINALIZERS, OWNER_REFS, Path, parse  # noqa: E402
from memory_fields import field_set as field_set  # noqa: E402 - for the scenarios
from memory_writes import dotted  # noqa: E402
from memory_writes import rayservice_defaults as rayservice_defaults  # noqa: E402 - for the scenarios

ApiServer = MemoryApiServer | KubeClient
"""The operator's `ApiServer`, as either backend implements it."""

CONTRACT_LABEL = "servegraph.test/api-contract"
"""On every RayService the contract writes: the admission policy below keeps KubeRay off them."""

KEEP_KUBERAY_OUT = """
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: api-contract-no-kuberay}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [ray.io]
      apiVersions: ["*"]
      operations: [CREATE, UPDATE, DELETE]
      resources: [rayservices, rayservices/status]
  validations:
  - expression: request.userInfo.username != "kuberay-operator"
    message: the API contract's RayServices are written by the test alone
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: api-contract-no-kuberay}
spec:
  policyName: api-contract-no-kuberay
  validationActions: [Deny]
  matchResources:
    objectSelector:
      matchExpressions: [{key: servegraph.test/api-contract, operator: Exists}]
"""
"""KubeRay, when a test of the session started it, would write the status of every RayService
(moving its resourceVersion): refused here on the contract's, so both backends see only the test's writes."""


class Backend(Protocol):
    api: ApiServer
    namespace: str

    async def apply_as(self, manager: str, manifest: Mapping[str, Any], force: bool = False) -> dict[str, Any]: ...

    async def patch_as(
        self, manager: str, kind: str, name: str, patch: Mapping[str, Any], status: bool = False
    ) -> dict[str, Any]: ...

    async def create_servegraph(self, name: str) -> str: ...

    async def delete_servegraph(self, name: str) -> None: ...

    async def get_servegraph(self, name: str) -> dict[str, Any] | None: ...


def servegraph(name: str) -> dict[str, Any]:
    spec = {"source": {"url": "https://registry.test/v1/graphs/mini", "tokenSecretRef": {"name": "token"}}}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ServeGraph", "metadata": {"name": name}, "spec": spec}


class Memory:
    def __init__(self, namespace: str) -> None:
        self.server = MemoryApiServer()
        self.api: ApiServer = self.server
        self.namespace = namespace

    async def apply_as(self, manager: str, manifest: Mapping[str, Any], force: bool = False) -> dict[str, Any]:
        return self.server.apply_as(manager, manifest, force)

    async def patch_as(
        self, manager: str, kind: str, name: str, patch: Mapping[str, Any], status: bool = False
    ) -> dict[str, Any]:
        key = (self.namespace, name)
        return self.server.update_as(manager, kind, key, patch, "status" if status else None)

    async def create_servegraph(self, name: str) -> str:
        body = servegraph(name)
        body["metadata"] |= {"namespace": self.namespace, "uid": str(uuid.uuid4())}
        self.server.servegraphs[(self.namespace, name)] = body
        return str(body["metadata"]["uid"])

    async def delete_servegraph(self, name: str) -> None:
        del self.server.servegraphs[(self.namespace, name)]

    async def get_servegraph(self, name: str) -> dict[str, Any] | None:
        return self.server.servegraphs.get((self.namespace, name))


def _kube_error(exc: ApiException) -> KubeError:
    status = json.loads(exc.body) if exc.body else {}
    return KubeError(str(status.get("reason") or exc.reason), str(status.get("message")), exc.status)


class Real:
    """The real API server: `api` as the operator's client, the rest as the admin."""

    def __init__(self, admin_api: Any, namespace: str) -> None:
        self.api: ApiServer = KubeClient(admin_api)
        self.namespace = namespace
        self.custom = client.CustomObjectsApi(admin_api)
        self.core = client.CoreV1Api(admin_api)

    async def apply_as(self, manager: str, manifest: Mapping[str, Any], force: bool = False) -> dict[str, Any]:
        name = manifest["metadata"]["name"]
        options = {"field_manager": manager, "force": force, "_content_type": "application/apply-patch+yaml"}
        try:
            if manifest["kind"] == "ConfigMap":
                await self.core.patch_namespaced_config_map(name, self.namespace, dict(manifest), **options)
                return await self._get("ConfigMap", name)
            where = (RAY_GROUP, RAY_VERSION, self.namespace, RAY_PLURAL, name)
            obj: dict[str, Any] = await self.custom.patch_namespaced_custom_object(*where, dict(manifest), **options)
        except ApiException as exc:
            raise _kube_error(exc) from None
        return obj

    async def patch_as(
        self, manager: str, kind: str, name: str, patch: Mapping[str, Any], status: bool = False
    ) -> dict[str, Any]:
        options = {"field_manager": manager, "_content_type": "application/merge-patch+json"}
        try:
            if kind == "ConfigMap":
                await self.core.patch_namespaced_config_map(name, self.namespace, dict(patch), **options)
                return await self._get(kind, name)
            where = (RAY_GROUP, RAY_VERSION, self.namespace, RAY_PLURAL, name)
            write = (
                self.custom.patch_namespaced_custom_object_status
                if status
                else self.custom.patch_namespaced_custom_object
            )
            obj: dict[str, Any] = await write(*where, dict(patch), **options)
        except ApiException as exc:
            raise _kube_error(exc) from None
        return obj

    async def _get(self, kind: str, name: str) -> dict[str, Any]:
        got = await (self.api.get_configmap if kind == "ConfigMap" else self.api.get_rayservice)(self.namespace, name)
        assert got is not None
        return got

    async def create_servegraph(self, name: str) -> str:
        obj = await self.custom.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, servegraph(name)
        )
        return str(obj["metadata"]["uid"])

    async def delete_servegraph(self, name: str) -> None:
        await self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    async def get_servegraph(self, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = await self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj


def _cut(path: Path) -> Path:
    """`path` up to its first list element, unless the list is one the stand-in keys (see memory_fields)."""
    for i, step in enumerate(path):
        if step[:2] in ("k:", "v:", "i:") and path[:i] not in (OWNER_REFS, FINALIZERS):
            return path[:i]
    return path


def owned(paths: Iterable[Path]) -> set[str]:
    """Paths as dotted strings, cut at lists the stand-in keeps atomic."""
    return {dotted(_cut(p)) for p in paths}


def owners(obj: Mapping[str, Any]) -> dict[str, set[str]]:
    """Who owns what: `manager/operation[/subresource]` → `owned` paths."""
    out: dict[str, set[str]] = {}
    for entry in obj["metadata"].get("managedFields") or ():
        who = "/".join(filter(None, (entry["manager"], entry["operation"], entry.get("subresource"))))
        out[who] = owned(parse(entry.get("fieldsV1") or {}))
    return out


def view(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the operator can observe of an object, less what only the server makes up (uid, times, versions)."""
    meta = obj["metadata"]
    kept = {k: meta[k] for k in ("labels", "annotations", "ownerReferences", "finalizers", "generation") if k in meta}
    rest = {k: v for k, v in obj.items() if k not in ("metadata", "apiVersion", "kind")}
    return {**rest, **kept, "deleting": "deletionTimestamp" in meta}
