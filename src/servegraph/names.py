"""Every name servegraph shares with Kubernetes: API groups, kinds, labels, annotations,
condition types, and how an object is keyed.

A leaf on purpose (it imports nothing of servegraph): the renderer, the Kubernetes client,
the operator, `servegraph status` and the tests all spell these the same way by importing
them from here, so renaming one cannot leave a watch filter, a field manager or a status
reader behind.
"""

from __future__ import annotations

from enum import StrEnum

# The ServeGraph custom resource (config/crd).
GROUP = "servegraph.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
PLURAL = "servegraphs"
KIND = "ServeGraph"

# KubeRay's RayService, which the operator renders and applies.
RAY_GROUP = "ray.io"
RAY_VERSION = "v1"
RAY_API_VERSION = f"{RAY_GROUP}/{RAY_VERSION}"
RAY_PLURAL = "rayservices"
RAY_KIND = "RayService"

# The Gateway API's HTTPRoute a ServeGraph's spec.expose makes, on an administrator's Gateway.
GATEWAY_GROUP = "gateway.networking.k8s.io"
GATEWAY_VERSION = "v1"
GATEWAY_API_VERSION = f"{GATEWAY_GROUP}/{GATEWAY_VERSION}"
ROUTE_PLURAL = "httproutes"
ROUTE_KIND = "HTTPRoute"

# On every RayService the operator owns; the operator's RayService watch selects by it.
GRAPH_LABEL = f"{GROUP}/graph"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
# On a ServeGraph: which operator shard reconciles it (`servegraph run --shard`); none: the main one.
SHARD_LABEL = f"{GROUP}/shard"
MANAGED_BY = "servegraph"

# sha256 over what servegraph renders: equal hashes mean there is nothing to write.
SPEC_HASH_ANNOTATION = f"{GROUP}/spec-hash"
# Set on a ServeGraph (by users or the events endpoint) to download its graph again.
REFRESH_ANNOTATION = f"{GROUP}/refresh"
# Set on a ServeGraph (by users or `servegraph restart`) to roll its Ray cluster: the value is
# rendered into the head and worker pod templates, so KubeRay builds a new cluster.
RESTARTED_AT_ANNOTATION = f"{GROUP}/restartedAt"
CANARY_ANNOTATION = f"{GROUP}/canary"
"""`promote@<time>` or `abort@<time>` (`servegraph promote|abort NAME`): the operator ends the
running canary so, once per value (operator/rollout/canary.py)."""

# On the head's pod template when applications name their own gRPC servicer functions: a
# digest of the list. Ray Serve reads gRPC options only when it starts, so a changed list
# must change KubeRay's cluster hash, which builds a new cluster whose Serve serves it.
GRPC_SERVICERS_ANNOTATION = f"{GROUP}/grpcServicers"

# Server-side apply's field manager, and the component named on Events and in the user agent.
FIELD_MANAGER = "servegraph-operator"

# Where the operator runs by default (config/manager) and the Lease its replicas elect a leader with.
OPERATOR_NAMESPACE = "servegraph-system"
LEASE_NAME = "servegraph-operator"

Key = tuple[str, str]
"""(namespace, name) of a namespaced object: how the operator's caches, queue, metrics and
Secret reads know a ServeGraph, a RayService or a Secret."""


class ConditionType(StrEnum):
    """The conditions of a ServeGraph's status, in the order they are written and shown.

    Strings (a `StrEnum`), so a member is what the API server stores and compares equal to
    the text a reader finds there (`kubectl wait --for=condition=Ready`, config/crd's Ready
    column).
    """

    FETCHED = "Fetched"
    GRAPH_VALID = "GraphValid"
    APPLIED = "Applied"
    READY = "Ready"
    PROGRESSING = "Progressing"
