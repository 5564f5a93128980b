"""In-memory stand-ins for the reconciler's two edges, for unit tests only.

`MemoryApiServer` implements the reconciler's `ApiServer` protocol over dicts and
`MemoryRegistry` its `Fetcher`. They model what the reconciler relies on (server-side
apply replaces our fields, keeps KubeRay's status and counts spec changes in the
generation, and without `force` answers 409 over an object another field manager
wrote; every write moves the resourceVersion, and an apply carrying an older one
answers 409; the status write is refused for an object that is gone or has another
uid; a registry answers 304 to its own ETag and 401 to a wrong token) and record every call,
so tests can assert what the operator read and wrote. The real API server and registry
are exercised by tests/integration and tests/source; these are what lets the
reconcile be tested in milliseconds.
"""

from __future__ import annotations

import base64
import copy
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from servegraph.kube import KubeError
from servegraph.source import Fetched, FetchError, FetchRequest

Key = tuple[str, str]
MANAGER = "servegraph-operator"


@dataclass
class MemoryApiServer:
    servegraphs: dict[Key, dict[str, Any]] = field(default_factory=dict)
    rayservices: dict[Key, dict[str, Any]] = field(default_factory=dict)
    secrets: dict[Key, dict[str, str]] = field(default_factory=dict)
    configmaps: dict[Key, dict[str, str]] = field(default_factory=dict)
    configmap_objects: dict[Key, dict[str, Any]] = field(default_factory=dict)
    """Whole ConfigMaps written by server-side apply (the rollback store)."""
    events: list[tuple[str, str, str]] = field(default_factory=list)
    """(type, reason, message) of every Event posted."""
    calls: list[str] = field(default_factory=list)
    """Every call by method name, reads and writes, in order."""
    failures: dict[str, KubeError] = field(default_factory=dict)
    """Method name → the error every call of it raises until removed."""
    versions: int = 0
    """The last resourceVersion given out (one counter for every object, as etcd's revision)."""
    after_read: dict[str, Callable[[], object]] = field(default_factory=dict)
    """Method name → run once just after that read answers: a hand edit landing between
    the operator's read and its write."""

    def add_secret(self, namespace: str, name: str, **values: str) -> dict[str, str]:
        data = {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}
        self.secrets[(namespace, name)] = data
        return data

    def writes(self) -> list[str]:
        writes = {"apply_rayservice", "delete_rayservice", "patch_servegraph_status", "post_event", "apply_configmap"}
        return [c for c in self.calls if c in writes]

    def _call(self, method: str) -> None:
        self.calls.append(method)
        if method in self.failures:
            raise self.failures[method]

    def _read(self, method: str, obj: dict[str, Any] | None) -> dict[str, Any] | None:
        copied = copy.deepcopy(obj) if obj is not None else None
        edit = self.after_read.pop(method, None)
        if edit is not None:
            edit()
        return copied

    def next_version(self) -> str:
        self.versions += 1
        return str(self.versions)

    def _precondition(self, manifest: Mapping[str, Any], existing: Mapping[str, Any] | None) -> None:
        """An apply carrying metadata.resourceVersion writes only that version of the object."""
        wanted = manifest["metadata"].get("resourceVersion")
        if wanted is None:
            return
        if existing is None:
            raise KubeError("NotFound", f"{manifest['metadata']['name']} not found", 404)
        if existing["metadata"].get("resourceVersion") != wanted:
            raise KubeError(
                "Conflict",
                "Operation cannot be fulfilled: the object has been modified; "
                "please apply your changes to the latest version and try again",
                409,
            )

    def edit(self, obj: dict[str, Any], manager: str = "kubectl-edit") -> None:
        """Record a write by someone else to `obj` (changed in place): a new resourceVersion, and the manager."""
        meta = obj["metadata"]
        meta["resourceVersion"] = self.next_version()
        managers = {m["manager"] for m in meta.get("managedFields", [])} | {manager}
        meta["managedFields"] = [{"manager": m} for m in sorted(managers)]

    async def get_rayservice(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._call("get_rayservice")
        return self._read("get_rayservice", self.rayservices.get((namespace, name)))

    async def apply_rayservice(self, manifest: Mapping[str, Any], force: bool = True) -> dict[str, Any]:
        self._call("apply_rayservice")
        key = (manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        obj = copy.deepcopy(dict(manifest))
        existing = self.rayservices.get(key)
        self._precondition(manifest, existing)
        managers = {m["manager"] for m in (existing or {}).get("metadata", {}).get("managedFields", [])}
        if existing is not None and not force and managers - {MANAGER}:
            raise KubeError("Conflict", f"Apply failed with conflicts: fields managed by {sorted(managers)}", 409)
        generation = 1
        if existing is not None:
            generation = existing["metadata"].get("generation", 1)
            generation += existing.get("spec") != obj.get("spec")  # as the API server counts spec changes
            if "status" in existing:
                obj["status"] = copy.deepcopy(existing["status"])
            for kept in ("finalizers", "deletionTimestamp"):  # KubeRay's, and the API server's
                if kept in existing["metadata"]:
                    obj["metadata"][kept] = copy.deepcopy(existing["metadata"][kept])
        obj["metadata"]["generation"] = generation
        obj["metadata"]["managedFields"] = [{"manager": m} for m in sorted(managers | {MANAGER})]
        obj["metadata"]["resourceVersion"] = self.next_version()
        self.rayservices[key] = obj
        return copy.deepcopy(obj)

    async def delete_rayservice(self, namespace: str, name: str, uid: str, resource_version: str) -> None:
        """Delete with uid and resourceVersion preconditions (409 otherwise); an object with
        finalizers (KubeRay's) is only marked deleted until they are removed."""
        self._call("delete_rayservice")
        obj = self.rayservices.get((namespace, name))
        if obj is None:
            return
        meta = obj["metadata"]
        if meta.get("uid", uid) != uid or meta.get("resourceVersion") != resource_version:
            raise KubeError("Conflict", "Operation cannot be fulfilled: the object has been modified", 409)
        if meta.get("finalizers"):
            meta.setdefault("deletionTimestamp", "2026-01-01T00:00:00Z")
            meta["resourceVersion"] = self.next_version()
        else:
            del self.rayservices[(namespace, name)]

    def kuberay_reports(self, namespace: str, name: str, **apps: str) -> dict[str, Any]:
        """What KubeRay writes once it acted on the current spec: observedGeneration and app statuses."""
        obj = self.rayservices[(namespace, name)]
        obj["status"] = {
            "observedGeneration": obj["metadata"]["generation"],
            "activeServiceStatus": {
                "rayClusterName": f"{name}-a",
                "applicationStatuses": {app: {"status": status} for app, status in apps.items()},
            },
        }
        obj["metadata"]["resourceVersion"] = self.next_version()  # a status write moves it too
        return copy.deepcopy(obj)

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._call("get_configmap")
        return self._read("get_configmap", self.configmap_objects.get((namespace, name)))

    async def apply_configmap(self, manifest: Mapping[str, Any], force: bool = True) -> dict[str, Any]:
        self._call("apply_configmap")
        key = (manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        existing = self.configmap_objects.get(key)
        self._precondition(manifest, existing)
        managers = {m["manager"] for m in (existing or {}).get("metadata", {}).get("managedFields", [])}
        if existing is not None and not force and managers - {MANAGER}:
            raise KubeError("Conflict", f"Apply failed with conflicts: fields managed by {sorted(managers)}", 409)
        obj = copy.deepcopy(dict(manifest))
        obj["metadata"]["managedFields"] = [{"manager": m} for m in sorted(managers | {MANAGER})]
        obj["metadata"]["resourceVersion"] = self.next_version()
        self.configmap_objects[key] = obj
        return copy.deepcopy(obj)

    async def patch_servegraph_status(self, namespace: str, name: str, uid: str, status: Mapping[str, Any]) -> None:
        self._call("patch_servegraph_status")
        body = self.servegraphs.get((namespace, name))
        if body is None:
            raise KubeError("NotFound", f'servegraphs "{name}" not found', 404)
        if body["metadata"]["uid"] != uid:
            raise KubeError("Replaced", f"patch status of ServeGraph {namespace}/{name}: replaced", 409)
        body["status"] = copy.deepcopy(dict(status))

    async def post_event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str, now: str) -> None:
        self._call("post_event")
        self.events.append((type_, reason, message))

    async def read_secret_data(self, namespace: str, name: str) -> dict[str, str]:
        self._call("read_secret_data")
        if (namespace, name) not in self.secrets:
            raise KubeError("NotFound", f'secrets "{name}" not found', 404)
        return dict(self.secrets[(namespace, name)])

    async def read_configmap_key(self, namespace: str, name: str, key: str) -> str:
        self._call("read_configmap_key")
        data = self.configmaps.get((namespace, name))
        if data is None:
            raise KubeError("NotFound", f'configmaps "{name}" not found', 404)
        if key not in data:
            raise KubeError("KeyNotFound", f"ConfigMap {namespace}/{name} has no key {key!r}")
        return data[key]


@dataclass
class MemoryRegistry:
    """Graphs by URL behind one bearer token, with ETags the way the sample registry makes them."""

    token: str
    graphs: dict[str, bytes] = field(default_factory=dict)
    requests: list[FetchRequest] = field(default_factory=list)

    async def __call__(self, request: FetchRequest) -> Fetched:
        self.requests.append(request)
        if request.token.strip() != self.token:
            raise FetchError("Unauthorized", f"{request.url} answered HTTP 401", retryable=False, status=401)
        if request.url not in self.graphs:
            raise FetchError("NotFound", f"{request.url} answered HTTP 404", retryable=False, status=404)
        body = self.graphs[request.url]
        digest = hashlib.sha256(body).hexdigest()
        etag = f'"{digest[:16]}"'
        if request.etag == etag:
            return Fetched(True, b"", etag, "", 304, request.url)
        return Fetched(False, body, etag, digest, 200, request.url)
