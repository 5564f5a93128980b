"""What `servegraph status` reads: the ServeGraph, its RayService, its Events, and Ray
Serve's own view of the active cluster — all through the API server, so it works from
wherever kubectl does.

Ray Serve is asked through the API server's service proxy to the RayService's head
Service (`<rayservice>-head-svc`, port `dashboard`), the address KubeRay itself uses;
without `services/proxy` permission, or when the dashboard wants a token, the tree
shows the replicas the config asks for and says why. The RayService's Ray clusters
(active and pending) and their pods (by KubeRay's `ray.io/cluster` label) are read for
why one is not running; without permission to read them the tree says so.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.rest import ApiException

from servegraph.kube import connect
from servegraph.names import GROUP, KIND, PLURAL, RAY_GROUP, RAY_PLURAL, RAY_VERSION, VERSION
from servegraph.statustree.pods import CLUSTER_LABEL
from servegraph.statustree.tree import Snapshot

SERVE_TIMEOUT_S = 5.0


class NotFound(Exception):
    """The ServeGraph does not exist."""


class GatherError(Exception):
    """The API server refused or failed a read the tree cannot do without; one line."""


async def gather(
    name: str,
    namespace: str | None,
    *,
    kubeconfig: str | None = None,
    context: str | None = None,
    live_replicas: bool = True,
) -> Snapshot:
    namespace = namespace or default_namespace(kubeconfig, context)
    api = await connect(kubeconfig, context)
    try:
        custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        servegraph = await _read(
            custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, _preload_content=False),
            f"ServeGraph {namespace}/{name}",
        )
        if servegraph is None:
            raise NotFound(f"ServeGraph {namespace}/{name} not found")
        rs_name = (servegraph.get("status") or {}).get("rayServiceName")
        rayservice = None
        if rs_name:
            rayservice = await _read(
                custom.get_namespaced_custom_object(
                    RAY_GROUP, RAY_VERSION, namespace, RAY_PLURAL, rs_name, _preload_content=False
                ),
                f"RayService {namespace}/{rs_name}",
            )
        selector = f"involvedObject.kind={KIND},involvedObject.name={name}"
        events = await _read(
            core.list_namespaced_event(namespace, field_selector=selector, _preload_content=False),
            f"Events of ServeGraph {namespace}/{name}",
        )
        serve: dict[str, Any] | None = None
        note: str | None = "not asked (--no-replicas)"
        if live_replicas and rayservice is not None:
            serve, note = await _serve_details(core, namespace, f"{rs_name}-head-svc")
        elif rayservice is None:
            note = "no RayService"
        clusters, pods, ray_note = await _ray_clusters(custom, core, namespace, rayservice)
        items = (events or {}).get("items") or []
        return Snapshot(servegraph, rayservice, items, serve, note, clusters, pods, ray_note)
    finally:
        await api.close()


def default_namespace(kubeconfig: str | None, context: str | None = None) -> str:
    """The namespace of the kubeconfig's `context` (else its current one), the pod's own in
    a cluster, else `default`: where kubectl would look."""
    try:
        contexts, active = config.list_kube_config_contexts(config_file=kubeconfig or os.environ.get("KUBECONFIG"))
        if context:
            active = next((c for c in contexts or () if c.get("name") == context), None)
        namespace = (active or {}).get("context", {}).get("namespace")
        if namespace:
            return str(namespace)
    except (config.ConfigException, OSError, TypeError):
        pass
    in_cluster = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    return in_cluster.read_text().strip() if in_cluster.is_file() else "default"


async def _read(call: Any, what: str) -> Any:
    """One GET with the raw body (no model deserialization); None for 404."""
    try:
        resp = await call
        body = await resp.read()
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise GatherError(f"{what}: {exc.status} {exc.reason}") from None
    if resp.status == 404:
        return None
    if not 200 <= resp.status < 300:
        raise GatherError(f"{what}: HTTP {resp.status} {_message(body)}")
    return json.loads(body)


async def _ray_clusters(
    custom: Any, core: Any, namespace: str, rayservice: dict[str, Any] | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str | None]:
    """The RayService's active and pending RayClusters and their pods, or why they could not be read."""
    status = (rayservice or {}).get("status") or {}
    names = sorted(
        {
            str(name)
            for key in ("activeServiceStatus", "pendingServiceStatus")
            if (name := (status.get(key) or {}).get("rayClusterName"))
        }
    )
    clusters: list[dict[str, Any]] = []
    try:
        for name in names:
            found = await _read(
                custom.get_namespaced_custom_object(
                    RAY_GROUP, RAY_VERSION, namespace, "rayclusters", name, _preload_content=False
                ),
                f"RayCluster {namespace}/{name}",
            )
            clusters += [found] if found is not None else []
        if not names:
            return clusters, [], None
        resp = await core.list_namespaced_pod(
            namespace, label_selector=f"{CLUSTER_LABEL} in ({','.join(names)})", _preload_content=False
        )
        body = await resp.read()
    except ApiException as exc:
        return clusters, [], f"the API server answered {exc.status} {exc.reason}"
    except GatherError as exc:
        return clusters, [], str(exc)
    if not 200 <= resp.status < 300:
        return clusters, [], f"the API server answered HTTP {resp.status}: {_message(body) or 'no message'}"
    return clusters, list(json.loads(body).get("items") or []), None


async def _serve_details(core: Any, namespace: str, service: str) -> tuple[dict[str, Any] | None, str | None]:
    """Ray Serve's applications document through the service proxy, or why it could not be read."""
    try:
        resp = await core.connect_get_namespaced_service_proxy_with_path(
            f"{service}:dashboard",
            namespace,
            "api/serve/applications/",
            _preload_content=False,
            _request_timeout=SERVE_TIMEOUT_S,
        )
        body = await resp.read()
    except ApiException as exc:
        return None, f"the API server's service proxy answered {exc.status} {exc.reason}"
    except (TimeoutError, OSError) as exc:
        return None, f"Ray's dashboard did not answer through the service proxy ({type(exc).__name__})"
    if resp.status != 200:
        return None, f"the service proxy to Ray's dashboard answered HTTP {resp.status}"
    try:
        doc = json.loads(body)
    except ValueError:
        return None, "Ray's dashboard answered something that is not JSON"
    return (doc, None) if isinstance(doc, dict) else (None, "Ray's dashboard answered an unexpected document")


def _message(body: bytes) -> str:
    try:
        return str(json.loads(body).get("message", ""))
    except (ValueError, AttributeError):
        return ""
