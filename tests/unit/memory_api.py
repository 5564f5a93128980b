"""In-memory stand-ins for the reconciler's two edges, for unit tests only.

`MemoryApiServer` implements the reconciler's `ApiServer` protocol over dicts and
`MemoryRegistry` its `Fetcher`. They model what the reconciler relies on, and
tests/integration/test_api_contract.py runs one scenario suite against this stand-in and
the real API server so the two cannot drift: server-side apply per field manager
(memory_writes: other managers' fields kept, a conflict only over a field another
manager owns with another value, an omitted field of ours removed); the schema defaults
KubeRay's CRD fills in; KubeRay's status kept by our writes and written through the
status subresource; a generation that counts spec changes; a resourceVersion that moves
on every change and not on a write that changes nothing; an apply carrying an older one
answered 409; deletes with uid and resourceVersion preconditions, held by finalizers; the
status write refused for an object that is gone or has another uid. A registry answers
304 to its own ETag and 401 to a wrong token. Both record every call, so tests can assert
what the operator read and wrote. There are no watches: the reconciler gets none through
`ApiServer` (kopf runs them), tests hand it what a watch would deliver.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memory_fields import SERVER_METADATA
from memory_writes import Defaults, apply, httproute_defaults, merge_patch, no_defaults, rayservice_defaults, update

from servegraph.kube import KubeError
from servegraph.names import Key
from servegraph.source import Fetched, FetchError, FetchRequest

MANAGER = "servegraph-operator"
KUBERAY = "kuberay-operator"
NOW = "2026-01-01T00:00:00Z"
_SERVER = SERVER_METADATA
_MODIFIED = "the object has been modified; please apply your changes to the latest version and try again"


def _content(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the generation counts: everything but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


@dataclass
class MemoryApiServer:
    servegraphs: dict[Key, dict[str, Any]] = field(default_factory=dict)
    rayservices: dict[Key, dict[str, Any]] = field(default_factory=dict)
    secrets: dict[Key, dict[str, str]] = field(default_factory=dict)
    configmaps: dict[Key, dict[str, str]] = field(default_factory=dict)
    """ConfigMap data by key, for `read_configmap_key` (what a test seeds by hand)."""
    configmap_objects: dict[Key, dict[str, Any]] = field(default_factory=dict)
    """Whole ConfigMaps written by server-side apply (the rollback store); `read_configmap_key` reads them too."""
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
    httproutes: dict[Key, dict[str, Any]] = field(default_factory=dict)
    """The HTTPRoutes of spec.expose (the RouteApi), by server-side apply as the others."""
    written: dict[tuple[str, Key], dict[str, Any]] = field(default_factory=dict)
    """Each object as this server last stored it: what `edit` compares a hand edit with."""

    def add_secret(self, namespace: str, name: str, **values: str) -> dict[str, str]:
        data = {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}
        self.secrets[(namespace, name)] = data
        return data

    def writes(self) -> list[str]:
        writes = {
            "apply_rayservice",
            "delete_rayservice",
            "patch_servegraph_status",
            "post_event",
            "create_configmap",
            "patch_configmap",
            "apply_httproute",
            "delete_httproute",
        }
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

    def _kind(self, kind: str) -> tuple[dict[Key, dict[str, Any]], bool, Defaults]:
        """The store of `kind`, whether it is a custom resource (it has a generation), its defaults."""
        if kind == "RayService":
            return self.rayservices, True, rayservice_defaults
        if kind == "ConfigMap":
            return self.configmap_objects, False, no_defaults
        if kind == "HTTPRoute":
            return self.httproutes, True, httproute_defaults
        raise ValueError(f"the stand-in keeps no {kind}")

    def _commit(self, kind: str, key: Key, before: Mapping[str, Any] | None, obj: dict[str, Any]) -> dict[str, Any]:
        """Store `obj` as the new state of what was `before`: a new resourceVersion (none when
        nothing changed), uid and generation as the API server keeps them. Returns a copy."""
        store, custom, _ = self._kind(kind)
        if before is not None and obj == before:
            return copy.deepcopy(obj)
        meta = obj["metadata"]
        if sum(1 for ref in meta.get("ownerReferences") or () if ref.get("controller")) > 1:
            raise KubeError(
                "Invalid", "metadata.ownerReferences: Only one reference can have Controller set to true", 422
            )
        if before is None:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", NOW)
            if custom:
                meta.setdefault("generation", 1)
        elif custom and _content(obj) != _content(before):
            meta["generation"] = int(before["metadata"].get("generation") or 1) + 1
        meta["resourceVersion"] = self.next_version()
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):  # the last finalizer gone
            store.pop(key, None)
            self.written.pop((kind, key), None)
        else:
            store[key] = obj
            self.written[(kind, key)] = copy.deepcopy(obj)
        return copy.deepcopy(obj)

    def _precondition(self, manifest: Mapping[str, Any], existing: Mapping[str, Any] | None) -> None:
        """An apply carrying metadata.resourceVersion writes only that version of an existing
        object; one that does not exist is created (the API server ignores it then)."""
        wanted = (manifest.get("metadata") or {}).get("resourceVersion")
        if wanted is None or existing is None:
            return
        if existing["metadata"].get("resourceVersion") != wanted:
            raise KubeError("Conflict", f"Operation cannot be fulfilled: {_MODIFIED}", 409)

    def apply_as(self, manager: str, manifest: Mapping[str, Any], force: bool = False) -> dict[str, Any]:
        """Server-side apply by `manager` (a RayService or a ConfigMap)."""
        meta = manifest["metadata"]
        key = (meta["namespace"], meta["name"])
        store, _, defaults = self._kind(manifest["kind"])
        existing = store.get(key)
        self._precondition(manifest, existing)
        obj = apply(copy.deepcopy(existing), manifest, manager, force, defaults)
        return self._commit(manifest["kind"], key, existing, obj)

    def create_as(self, manager: str, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """A create (POST) by `manager`: 409 AlreadyExists when one of that name exists."""
        meta = manifest["metadata"]
        key = (meta["namespace"], meta["name"])
        store, _, defaults = self._kind(manifest["kind"])
        if key in store:
            raise KubeError("AlreadyExists", f'{manifest["kind"]} "{key[1]}" already exists', 409)
        return self._commit(manifest["kind"], key, None, update(None, manifest, manager, defaults=defaults))

    def update_as(
        self, manager: str, kind: str, key: Key, patch: Mapping[str, Any], subresource: str | None = None
    ) -> dict[str, Any]:
        """A merge patch by `manager` (an update); `subresource="status"` writes only the status.
        A patch carrying metadata.resourceVersion writes only that version (409 Conflict else)."""
        store, _, defaults = self._kind(kind)
        live = store.get(key)
        if live is None:
            raise KubeError("NotFound", f"{kind} {key[1]} not found", 404)
        self._precondition(patch, live)
        patched = merge_patch(live, patch)
        new = copy.deepcopy(live)
        if subresource == "status":
            new["status"] = patched.get("status")
            if new["status"] is None:
                del new["status"]
        else:
            new = {**patched, "status": live["status"]} if "status" in live else dict(patched)
            new["metadata"] = {**patched["metadata"], **{k: v for k, v in live["metadata"].items() if k in _SERVER}}
        return self._commit(kind, key, live, update(live, new, manager, subresource, defaults))

    def edit(self, obj: dict[str, Any], manager: str = "kubectl-edit") -> None:
        """Record a write by `manager` to `obj`, a stored object the test changed in place (as
        `kubectl edit` would): it owns what it changed, and `obj` gets the new resourceVersion."""
        for kind in ("RayService", "ConfigMap", "HTTPRoute"):
            store, _, defaults = self._kind(kind)
            key = next((k for k, v in store.items() if v is obj), None)
            if key is not None:
                before = self.written.get((kind, key))
                stored = self._commit(kind, key, before, update(before, obj, manager, defaults=defaults))
                obj.clear()
                obj.update(stored)
                if key in store:
                    store[key] = obj
                return
        raise ValueError("edit: not an object this server stores")

    async def get_rayservice(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._call("get_rayservice")
        return self._read("get_rayservice", self.rayservices.get((namespace, name)))

    async def apply_rayservice(self, manifest: Mapping[str, Any], force: bool = True) -> dict[str, Any]:
        self._call("apply_rayservice")
        return self.apply_as(MANAGER, manifest, force)

    async def delete_rayservice(self, namespace: str, name: str, uid: str, resource_version: str) -> None:
        """Delete with uid and resourceVersion preconditions (409 otherwise); an object with
        finalizers (KubeRay's) is only marked deleted until they are removed."""
        self._call("delete_rayservice")
        key = (namespace, name)
        obj = self.rayservices.get(key)
        if obj is None:
            return
        meta = obj["metadata"]
        if meta.get("uid", uid) != uid:
            raise KubeError("Conflict", f"the UID in the precondition ({uid}) does not match the UID in record", 409)
        if meta.get("resourceVersion") != resource_version:
            raise KubeError(
                "Conflict", f"the ResourceVersion in the precondition ({resource_version}) does not match", 409
            )
        if meta.get("deletionTimestamp"):
            return  # being deleted already: nothing changes
        if not meta.get("finalizers"):
            del self.rayservices[key]
            self.written.pop(("RayService", key), None)
            return
        marked = copy.deepcopy(obj)
        marked["metadata"] |= {"deletionTimestamp": NOW, "deletionGracePeriodSeconds": 0}
        marked["metadata"]["generation"] = int(meta.get("generation") or 1) + 1  # as it does for custom resources
        self._commit("RayService", key, obj, marked)

    async def get_httproute(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._call("get_httproute")
        return self._read("get_httproute", self.httproutes.get((namespace, name)))

    async def apply_httproute(self, manifest: Mapping[str, Any], force: bool = True) -> dict[str, Any]:
        self._call("apply_httproute")
        return self.apply_as(MANAGER, manifest, force)

    async def delete_httproute(self, namespace: str, name: str, uid: str, resource_version: str) -> None:
        """Delete with uid and resourceVersion preconditions (409 otherwise); no finalizers."""
        self._call("delete_httproute")
        obj = self.httproutes.get((namespace, name))
        if obj is None:
            return
        if (obj["metadata"].get("uid"), obj["metadata"].get("resourceVersion")) != (uid, resource_version):
            raise KubeError("Conflict", "the precondition does not match the object", 409)
        del self.httproutes[(namespace, name)]
        self.written.pop(("HTTPRoute", (namespace, name)), None)

    def kuberay_reports(self, namespace: str, name: str, **apps: str) -> dict[str, Any]:
        """What KubeRay writes through the status subresource once it acted on the current spec:
        observedGeneration, app statuses, and the time of the write (so each report changes it)."""
        obj = self.rayservices[(namespace, name)]
        status = {
            "observedGeneration": obj["metadata"]["generation"],
            "lastUpdateTime": f"2026-01-01T00:{self.versions // 60 % 60:02d}:{self.versions % 60:02d}Z",
            "activeServiceStatus": {
                "rayClusterName": f"{name}-a",
                "applicationStatuses": {app: {"status": status} for app, status in apps.items()},
            },
        }
        patch = {"status": {**{k: None for k in obj.get("status") or {}}, **status}}
        return self.update_as(KUBERAY, "RayService", (namespace, name), patch, subresource="status")

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._call("get_configmap")
        return self._read("get_configmap", self.configmap_objects.get((namespace, name)))

    async def create_configmap(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        self._call("create_configmap")
        return self.create_as(MANAGER, manifest)

    async def patch_configmap(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self._call("patch_configmap")
        return self.update_as(MANAGER, "ConfigMap", (namespace, name), patch)

    async def patch_servegraph_status(
        self, namespace: str, name: str, uid: str, status: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        self._call("patch_servegraph_status")
        body = self.servegraphs.get((namespace, name))
        if body is None:
            raise KubeError("NotFound", f'servegraphs "{name}" not found', 404)
        if body["metadata"]["uid"] != uid:
            raise KubeError("Replaced", f"patch status of ServeGraph {namespace}/{name}: replaced", 409)
        body["status"] = copy.deepcopy(dict(status))
        if "resourceVersion" not in body["metadata"]:
            return None  # a test's ServeGraph without versions: the write answers nothing to hold
        body["metadata"]["resourceVersion"] = self.next_version()
        return copy.deepcopy(body)

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
        if data is None and (namespace, name) in self.configmap_objects:
            data = self.configmap_objects[(namespace, name)].get("data") or {}
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
