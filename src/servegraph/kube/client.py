"""Async Kubernetes access (kubernetes_asyncio): RayServices, ServeGraph status,
Secrets, ConfigMaps and Events. Nothing here decides anything."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Awaitable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.rest import ApiException

from servegraph.operator.spec import GROUP, PLURAL, VERSION

FIELD_MANAGER = "servegraph-operator"
RAY_GROUP, RAY_VERSION, RAY_PLURAL = "ray.io", "v1", "rayservices"


class KubeError(Exception):
    """An API call failed; `reason` is the API's reason (NotFound, Forbidden, ...)."""

    def __init__(self, reason: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status


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


async def connect(kubeconfig: str | None = None) -> client.ApiClient:
    """A kubeconfig when one is given or found, else the in-cluster service account."""
    cfg = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    if kubeconfig or os.environ.get("KUBECONFIG") or Path(path).exists():  # noqa: ASYNC240 - once at start-up
        await config.load_kube_config(config_file=path, client_configuration=cfg)
    else:
        config.load_incluster_config(client_configuration=cfg)
    api = client.ApiClient(configuration=cfg)
    _trust_no_env(api)
    return api


def _trust_no_env(api: client.ApiClient) -> None:
    """Give the client a session that does not read the environment on every request.

    kubernetes_asyncio opens its aiohttp session with `trust_env=True`, so each
    request looks up proxy variables and parses ~/.netrc, twice through a thread
    pool: 8 % of the operator's CPU at 1,000 ServeGraphs. kopf's own client does
    not trust the environment either; a kubeconfig `proxy-url` still applies, as
    kubernetes_asyncio passes it with each request.
    """
    rest = api.rest_client
    connector = rest.pool_manager.connector
    rest.pool_manager.detach()  # closes the old session, keeps its connection pool
    rest.pool_manager = aiohttp.ClientSession(connector=connector, read_bufsize=2**21)


def secret_value(namespace: str, name: str, key: str, data: Mapping[str, str]) -> str:
    """One key of a Secret's (base64) data; errors name the Secret and key, never the value."""
    if key not in data:
        raise KubeError("KeyNotFound", f"Secret {namespace}/{name} has no key {key!r}")
    try:
        return base64.b64decode(data[key]).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        raise KubeError("InvalidValue", f"Secret {namespace}/{name} key {key!r} is not UTF-8 text") from None


async def _raw(call: Awaitable[Any], what: str) -> Any:
    """Await a generated-client call made with `_preload_content=False`.

    Skips the client's model deserialization (dateutil parsing of every timestamp,
    most of the operator's CPU per request at scale) and checks the status the
    client no longer checks itself.
    """
    try:
        resp = await call
        data = await resp.read()
    except ApiException as exc:
        raise _error(exc, what) from None
    if not 200 <= resp.status <= 299:
        raise _status_error(resp.status, resp.reason, data, what)
    return json.loads(data) if data else None


class Kube:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)

    async def get_rayservice(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = await self._custom.get_namespaced_custom_object(
                RAY_GROUP, RAY_VERSION, namespace, RAY_PLURAL, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _error(exc, f"get RayService {namespace}/{name}") from None
        return obj

    async def apply_rayservice(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply, forcing ownership of every field we render."""
        meta = manifest["metadata"]
        obj: dict[str, Any] = await _raw(
            self._custom.patch_namespaced_custom_object(
                RAY_GROUP,
                RAY_VERSION,
                meta["namespace"],
                RAY_PLURAL,
                meta["name"],
                body=dict(manifest),
                field_manager=FIELD_MANAGER,
                force=True,
                _content_type="application/apply-patch+yaml",
                _preload_content=False,
            ),
            f"apply RayService {meta['namespace']}/{meta['name']}",
        )
        return obj

    async def patch_servegraph_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        await _raw(
            self._custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                body={"status": dict(patch)},
                _content_type="application/merge-patch+json",
                _preload_content=False,
            ),
            f"patch status of ServeGraph {namespace}/{name}",
        )

    async def annotate_servegraph(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        try:
            await self._custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                body={"metadata": {"annotations": dict(annotations)}},
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            raise _error(exc, f"annotate ServeGraph {namespace}/{name}") from None

    async def read_secret_data(self, namespace: str, name: str) -> dict[str, str]:
        """A Secret's data (base64 values), as the watch delivers it."""
        obj = await _raw(
            self._core.read_namespaced_secret(name, namespace, _preload_content=False),
            f"read Secret {namespace}/{name}",
        )
        return dict(obj.get("data") or {})

    async def read_configmap_key(self, namespace: str, name: str, key: str) -> str:
        try:
            cm = await self._core.read_namespaced_config_map(name, namespace)
        except ApiException as exc:
            raise _error(exc, f"read ConfigMap {namespace}/{name}") from None
        data = cm.data or {}
        if key not in data:
            raise KubeError("KeyNotFound", f"ConfigMap {namespace}/{name} has no key {key!r}")
        return str(data[key])

    async def post_event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str, now: str) -> None:
        """A core/v1 Event on the ServeGraph; failures to post are not fatal."""
        meta = involved["metadata"]
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ServeGraph",
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
        await _raw(self._core.create_namespaced_event(meta["namespace"], body, _preload_content=False), "post Event")
