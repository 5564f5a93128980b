"""Async Kubernetes access (kubernetes_asyncio): RayServices, ServeGraph status,
Secrets, ConfigMaps and Events. Nothing here decides anything.

Three promises every call keeps, because a tenant's bad day must not become the
operator's: each call has a timeout (a stalled API connection costs seconds, not
a worker forever); every failure is a `KubeError` (never an aiohttp or socket
error a caller forgot); and no write is sent once `may_write` says no (leader
election's fence), while `abort_connections` resets every connection so that a
write already sent but stuck in the network is dropped, not delivered late.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp
import orjson
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.rest import ApiException

from servegraph.kube.session import session as _session
from servegraph.names import (
    API_VERSION,
    FIELD_MANAGER,
    GROUP,
    KIND,
    PLURAL,
    RAY_GROUP,
    RAY_PLURAL,
    RAY_VERSION,
    SHARD_LABEL,
    VERSION,
)

API_TIMEOUT_S = 10.0
_PRECONDITION = "the server rejected our request due to an error in our request"


class KubeError(Exception):
    """An API call failed; `reason` is the API's reason (NotFound, Forbidden, ...), or
    Timeout, Unavailable, NotLeader (the fence), Replaced (a uid precondition failed)."""

    def __init__(self, reason: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


def _pointer(key: str) -> str:
    """`key` as one JSON-pointer segment (RFC 6901): a label key's `/` is `~1`."""
    return key.replace("~", "~0").replace("/", "~1")


def _error(exc: ApiException, what: str) -> KubeError:
    return _status_error(exc.status, exc.reason, exc.body, what)


def _status_error(code: int | None, http_reason: str | None, body: bytes | str | None, what: str) -> KubeError:
    """Keep the API's own reason and message: they say which field or rule failed."""
    try:
        status = json.loads(body) if body else {}
    except ValueError:
        status = {}
    if not isinstance(status, dict):
        status = {}
    reason = str(status.get("reason") or http_reason or "Error")
    detail = status.get("message") or f"HTTP {code} {http_reason}"
    return KubeError(reason, f"{what}: {detail}", code)


async def connect(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient:
    """A kubeconfig (at its `context`, else its current one) when one is given or found, else
    the in-cluster service account."""
    cfg = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    if kubeconfig or os.environ.get("KUBECONFIG") or Path(path).exists():  # noqa: ASYNC240 - once at start-up
        await config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
    else:
        config.load_incluster_config(client_configuration=cfg)
    api = client.ApiClient(configuration=cfg)
    old = api.rest_client.pool_manager
    api.rest_client.pool_manager = _session(cfg)
    await old.close()
    return api


async def _raw(call: Awaitable[Any], what: str, decode: bool = True) -> Any:
    """Await a generated-client call made with `_preload_content=False`.

    Skips the client's model deserialization (dateutil parsing of every timestamp,
    most of the operator's CPU per request at scale) and checks the status the
    client no longer checks itself. Every failure becomes a KubeError. The answer is
    parsed by orjson, and not at all with `decode=False` (writes whose answer nobody
    reads: the whole ServeGraph after a status write, the Event just posted).
    """
    try:
        resp = await call
        data = await resp.read()
    except ApiException as exc:
        raise _error(exc, what) from None
    except TimeoutError:
        raise KubeError("Timeout", f"{what}: no answer from the API server in time") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise KubeError("Unavailable", f"{what}: {type(exc).__name__} talking to the API server") from None
    if not 200 <= resp.status <= 299:
        raise _status_error(resp.status, resp.reason, data, what)
    return orjson.loads(data) if data and decode else None


APPLY = "application/apply-patch+yaml"
MERGE = "application/merge-patch+json"


def _applying(force: bool) -> dict[str, str]:
    return {"fieldManager": FIELD_MANAGER, "force": "true" if force else "false"}


def _rayservice_path(namespace: str, name: str) -> str:
    return f"/apis/{RAY_GROUP}/{RAY_VERSION}/namespaces/{quote(namespace)}/{RAY_PLURAL}/{quote(name)}"


def _configmap_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace)}/configmaps/{quote(name)}"


class KubeClient:
    """The API calls the operator makes, on kubernetes_asyncio; implements the reconciler's `ApiServer`."""

    def __init__(
        self, api: client.ApiClient, timeout_s: float = API_TIMEOUT_S, may_write: Callable[[], bool] | None = None
    ) -> None:
        self.api = api
        self.timeout_s = timeout_s
        self.may_write = may_write
        self.shard: str | None = None
        """This operator's shard (`--shard`): status writes require the ServeGraph to still carry it."""
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)

    def _fence(self, what: str) -> None:
        if self.may_write is not None and not self.may_write():
            raise KubeError("NotLeader", f"{what}: this replica does not lead; nothing written")

    async def _get(self, path: str, what: str) -> dict[str, Any] | None:
        """A GET of one object; None when it is absent (404), any other failure raised."""
        try:
            obj: dict[str, Any] = await self._call("GET", path, what)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    async def _call(
        self,
        method: str,
        path: str,
        what: str,
        body: Any = None,
        content_type: str = "application/json",
        query: Mapping[str, str] | None = None,
        decode: bool = True,
    ) -> Any:
        """One request of the reconcile's own, straight on the client's session and credentials.

        What the generated client adds per call (its parameter checks, a recursive walk of
        the body, the stdlib JSON encoder) cost as much CPU as aiohttp's request itself, on
        every write of every ServeGraph; the body is encoded by orjson instead. The answer
        is read as `_raw` reads it.
        """
        api = self.api
        headers = {**api.default_headers, "Accept": "application/json", "Content-Type": content_type}
        queries = list((query or {}).items())
        await api.update_params_for_auth(headers, queries, ["BearerToken"])  # refreshes an expiring token
        rest = api.rest_client
        extra: dict[str, Any] = {}
        if rest.proxy:
            extra.update(proxy=rest.proxy, proxy_headers=rest.proxy_headers)
        if rest.server_hostname:
            extra["server_hostname"] = rest.server_hostname
        data = None if body is None else orjson.dumps(body)
        try:
            async with rest.pool_manager.request(
                method,
                api.configuration.host + path,
                params=queries,
                data=data,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                **extra,
            ) as resp:
                answer = await resp.read()
        except TimeoutError:
            raise KubeError("Timeout", f"{what}: no answer from the API server in time") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise KubeError("Unavailable", f"{what}: {type(exc).__name__} talking to the API server") from None
        if not 200 <= resp.status <= 299:
            raise _status_error(resp.status, resp.reason, answer, what)
        return orjson.loads(answer) if answer and decode else None

    async def abort_connections(self) -> None:
        """Reset every connection to the API server at once, in use or idle, and start afresh.

        What was sent and not yet received by the server is dropped by the kernel (see
        `_session`), so no write of this process can land after it returns.
        """
        rest = self.api.rest_client
        old = rest.pool_manager
        rest.pool_manager = _session(self.api.configuration)
        connector = old.connector
        if connector is not None:
            await connector.close(abort_ssl=True)
        await old.close()

    async def get_rayservice(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get(_rayservice_path(namespace, name), f"get RayService {namespace}/{name}")

    async def apply_rayservice(self, manifest: Mapping[str, Any], force: bool = True) -> dict[str, Any]:
        """Server-side apply. `force` takes over fields others set (drift repair on our own
        RayService); without it, a RayService someone else wrote answers 409 Conflict."""
        meta = manifest["metadata"]
        what = f"apply RayService {meta['namespace']}/{meta['name']}"
        self._fence(what)
        obj: dict[str, Any] = await self._call(
            "PATCH", _rayservice_path(meta["namespace"], meta["name"]), what, manifest, APPLY, _applying(force)
        )
        return obj

    async def delete_rayservice(self, namespace: str, name: str, uid: str, resource_version: str) -> None:
        """Delete the RayService only as it was read (uid and resourceVersion preconditions: 409
        otherwise); gone already is no error. KubeRay's finalizer removes its Ray clusters first."""
        what = f"delete RayService {namespace}/{name}"
        self._fence(what)
        where = (RAY_GROUP, RAY_VERSION, namespace, RAY_PLURAL, name)
        options = {"preconditions": {"uid": uid, "resourceVersion": resource_version}}
        delete = self._custom.delete_namespaced_custom_object
        try:
            await _raw(delete(*where, body=options, _preload_content=False, _request_timeout=self.timeout_s), what)
        except KubeError as exc:
            if exc.status != 404:
                raise

    async def patch_servegraph_status(
        self, namespace: str, name: str, uid: str, status: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """Write the whole status of the ServeGraph with this uid, and of no other; returns the
        object as written. A JSON patch whose first operation tests metadata.uid: the API server
        refuses it (raised as KubeError Replaced) if the name now belongs to a new object, or
        (NotFound) if it is gone. A merge patch's metadata.uid is ignored on /status."""
        what = f"patch status of ServeGraph {namespace}/{name}"
        self._fence(what)
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/uid", "value": uid}]
        if self.shard is not None:  # moved to another shard meanwhile: refused, as a replaced one is
            ops.append({"op": "test", "path": f"/metadata/labels/{_pointer(SHARD_LABEL)}", "value": self.shard})
        ops.append({"op": "add", "path": "/status", "value": status})
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{PLURAL}/{quote(name)}/status"
        try:
            written: dict[str, Any] | None = await self._call("PATCH", path, what, ops, "application/json-patch+json")
        except KubeError as exc:
            if exc.status == 422 and str(exc).endswith(_PRECONDITION):
                moved = ", or moved to another shard" if self.shard is not None else ""
                raise KubeError("Replaced", f"{what}: it was deleted and created again{moved}", 409) from None
            raise
        return written

    async def annotate_servegraph(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        """The events endpoint's write: any replica may make it (the leader's watch sees it)."""
        await _raw(
            self._custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                body={"metadata": {"annotations": dict(annotations)}},
                _content_type=MERGE,
                _preload_content=False,
                _request_timeout=self.timeout_s,
            ),
            f"annotate ServeGraph {namespace}/{name}",
        )

    async def read_secret_data(self, namespace: str, name: str) -> dict[str, str]:
        """A Secret's data (base64 values), read on demand: the operator may only `get` Secrets."""
        obj = await _raw(
            self._core.read_namespaced_secret(name, namespace, _preload_content=False, _request_timeout=self.timeout_s),
            f"read Secret {namespace}/{name}",
        )
        return dict(obj.get("data") or {})

    async def read_configmap_key(self, namespace: str, name: str, key: str) -> str:
        cm = await _raw(
            self._core.read_namespaced_config_map(
                name, namespace, _preload_content=False, _request_timeout=self.timeout_s
            ),
            f"read ConfigMap {namespace}/{name}",
        )
        data = cm.get("data") or {}
        if key not in data:
            raise KubeError("KeyNotFound", f"ConfigMap {namespace}/{name} has no key {key!r}")
        return str(data[key])

    async def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The whole ConfigMap as JSON (binaryData stays base64), or None when absent."""
        return await self._get(_configmap_path(namespace, name), f"read ConfigMap {namespace}/{name}")

    async def create_configmap(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Create a ConfigMap (the kept graphs); one of that name answers 409 AlreadyExists."""
        meta = manifest["metadata"]
        what = f"create ConfigMap {meta['namespace']}/{meta['name']}"
        self._fence(what)
        path = f"/api/v1/namespaces/{quote(meta['namespace'])}/configmaps"
        return dict(await self._call("POST", path, what, manifest, query={"fieldManager": FIELD_MANAGER}))

    async def patch_configmap(self, namespace: str, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """JSON merge patch; its metadata.resourceVersion is its precondition (409 Conflict)."""
        what = f"patch ConfigMap {namespace}/{name}"
        self._fence(what)
        query = {"fieldManager": FIELD_MANAGER}
        return dict(await self._call("PATCH", _configmap_path(namespace, name), what, patch, MERGE, query))

    async def post_event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str, now: str) -> None:
        """A core/v1 Event on the ServeGraph; failures to post are not fatal."""
        meta = involved["metadata"]
        self._fence("post Event")
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": os.environ.get("HOSTNAME", FIELD_MANAGER),
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self._call(
            "POST", f"/api/v1/namespaces/{quote(meta['namespace'])}/events", "post Event", body, decode=False
        )

    async def service_cidrs(self) -> list[str]:
        """The cluster's Service ranges (networking.k8s.io/v1 ServiceCIDRs), for the source policy."""
        networking = client.NetworkingV1Api(self.api)
        listed = await _raw(
            networking.list_service_cidr(_preload_content=False, _request_timeout=self.timeout_s),
            "list ServiceCIDRs",
        )
        return [cidr for item in listed.get("items") or () for cidr in (item.get("spec") or {}).get("cidrs") or ()]

    async def api_server_endpoints(self) -> list[tuple[str, int]]:
        """(address, port) of the API server as this client reaches it, and of the `kubernetes` Service."""
        found: list[tuple[str, int]] = []
        parts = urlsplit(self.api.configuration.host)
        port = parts.port or 443
        if parts.hostname:
            loop = asyncio.get_running_loop()
            try:
                infos = await loop.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
            except OSError:
                infos = []
            found += [(str(info[4][0]), port) for info in infos]
        host, service_port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if host and service_port and service_port.isdigit():
            found.append((host, int(service_port)))
        return sorted(set(found))

    async def api_server_slice_endpoints(self) -> list[tuple[str, int]]:
        """(address, port) of the API servers themselves: the `kubernetes` Service's EndpointSlice
        in `default` (its ClusterIP hides them, and a pod may reach them directly)."""
        discovery = client.DiscoveryV1Api(self.api)
        found = await _raw(
            discovery.read_namespaced_endpoint_slice(
                "kubernetes", "default", _preload_content=False, _request_timeout=self.timeout_s
            ),
            "read EndpointSlice default/kubernetes",
        )
        ports = [p["port"] for p in found.get("ports") or () if isinstance(p.get("port"), int)]
        addresses = [a for e in found.get("endpoints") or () for a in e.get("addresses") or ()]
        return sorted({(a, p) for a in addresses for p in ports})
