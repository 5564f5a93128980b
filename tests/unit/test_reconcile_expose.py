"""`spec.expose` through the reconciler on the in-memory API: the HTTPRoute owned and kept like the
RayService (server-side apply, nothing written when nothing changed, drift repaired, never one it
does not control), the administrator's allowlist of Gateways and gateway classes. The same on the
real API server with the Gateway API's CRDs: tests/integration/test_expose.py; through Traefik
over TLS with Ray answering: tests/node/test_expose.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from reconcile_support import KEY, NAME, NS, Cluster
from test_reconcile_suspend import conditions, message, serving, set_spec

from servegraph.names import SPEC_HASH_ANNOTATION
from servegraph.operator.gateways import GatewayPolicy
from servegraph.operator.metrics import Metrics
from servegraph.operator.queue import WorkQueue
from servegraph.operator.reconcile import Reconciler, RetryLater

POLICY = GatewayPolicy(frozenset({"traefik"}), frozenset({("gateways", "public"), ("shared", "*")}))
EXPOSE = {"gateway": {"namespace": "gateways", "name": "public"}, "hostnames": ["graph.example.test"]}


def allowing(c: Cluster, policy: GatewayPolicy = POLICY) -> None:
    c.queue = WorkQueue()
    c.reconciler = Reconciler(c.api, c.registry, Metrics(), c.queue, routes=c.api, gateways=policy)
    c.watch_servegraph()
    c.watch_rayservice()


def watch_route(c: Cluster, deleted: bool = False) -> None:
    c.reconciler.httproute_changed(copy.deepcopy(c.api.httproutes.get(KEY) or {"metadata": {}}), deleted=deleted)


async def exposed(**expose: Any) -> Cluster:
    c, _ = await serving()
    allowing(c)
    set_spec(c, expose={**EXPOSE, **expose})
    await c.reconcile()
    return c


async def test_the_route_sends_each_application_to_the_serve_service_through_the_allowed_gateway() -> None:
    c = await exposed()
    route = c.api.httproutes[KEY]
    assert route["spec"] == {
        "parentRefs": [
            {"group": "gateway.networking.k8s.io", "kind": "Gateway", "namespace": "gateways", "name": "public"}
        ],
        "hostnames": ["graph.example.test"],
        "rules": [
            {
                "matches": [{"path": {"type": "PathPrefix", "value": "/sentiment"}}],
                "backendRefs": [{"name": "mini-serve-svc", "port": 8000, "group": "", "kind": "Service", "weight": 1}],
            }
        ],
    }
    (owner,) = route["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("ServeGraph", NAME, "uid-1", True)
    assert route["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "servegraph"
    assert ("Normal", "Exposed", "created HTTPRoute mini on Gateway gateways/public (sentiment)") in c.api.events
    assert conditions(c)["Applied"] == ("True", "UpToDate")

    # Its own write delivered back, and any other reconcile: nothing written.
    watch_route(c)
    c.api.calls.clear()
    await c.reconcile()
    assert "apply_httproute" not in c.api.writes()


async def test_an_edit_or_a_deletion_by_hand_is_repaired() -> None:
    c = await exposed()
    route = c.api.httproutes[KEY]
    route["spec"]["hostnames"] = ["elsewhere.example.test"]  # the hash annotation left as it was
    c.api.edit(route)
    watch_route(c)
    c.api.calls.clear()
    await c.reconcile()
    assert c.api.writes()[:1] == ["apply_httproute"]
    assert c.api.httproutes[KEY]["spec"]["hostnames"] == ["graph.example.test"]

    watch_route(c, deleted=True)
    del c.api.httproutes[KEY]
    await c.reconcile()
    assert c.api.httproutes[KEY]["spec"]["hostnames"] == ["graph.example.test"], "created again"


async def test_a_path_of_its_own_is_rewritten_to_the_route_prefix_and_an_unknown_application_refused() -> None:
    c = await exposed(applications={"sentiment": {"path": "/v1/mood"}})
    (rule,) = c.api.httproutes[KEY]["spec"]["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1/mood"}}]
    assert rule["filters"] == [
        {
            "type": "URLRewrite",
            "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/sentiment"}},
        }
    ]
    set_spec(c, expose={**EXPOSE, "applications": {"nope": {"path": "/x"}}})
    await c.reconcile()
    assert conditions(c)["Applied"] == ("False", "ExposeInvalid")
    assert message(c, "Applied") == (
        "spec.expose.applications: nope: no such application with an HTTP route in the graph"
    )


async def test_a_gateway_or_a_class_the_administrator_does_not_allow_is_refused_by_name() -> None:
    c, _ = await serving()
    allowing(c)
    set_spec(c, expose={"gateway": {"namespace": "gateways", "name": "internet"}})
    await c.reconcile()
    assert conditions(c)["Fetched"] == ("False", "InvalidSpec")
    assert message(c, "Fetched") == (
        "spec.expose.gateway: Gateway gateways/internet is not allowed (allowed: gateways/public, shared/*; "
        "the operator's --allow-gateways)"
    )
    assert KEY not in c.api.httproutes

    set_spec(c, expose={"gateway": {"namespace": "shared", "name": "any"}})  # namespace/*
    await c.reconcile()
    assert c.api.httproutes[KEY]["spec"]["parentRefs"][0]["namespace"] == "shared"

    set_spec(
        c,
        rayService={
            "upgradeStrategy": "NewClusterWithIncrementalUpgrade",
            "clusterUpgradeOptions": {"gatewayClassName": "istio", "stepSizePercent": 10, "intervalSeconds": 30},
        },
    )
    await c.reconcile()
    assert conditions(c)["Fetched"] == ("False", "InvalidSpec")
    assert message(c, "Fetched").startswith(
        "spec.rayService.clusterUpgradeOptions.gatewayClassName: gateway class 'istio' is not allowed (allowed: "
        "traefik; the operator's --allow-gateway-classes)"
    )
    assert "istio" not in str(c.api.rayservices[KEY]["spec"]), "the RayService stays as it was"


async def test_by_default_no_gateway_is_allowed() -> None:
    c, _ = await serving()
    allowing(c, GatewayPolicy())
    set_spec(c, expose=EXPOSE)
    await c.reconcile()
    assert "allowed: none" in message(c, "Fetched") and KEY not in c.api.httproutes


async def test_a_route_of_that_name_someone_else_made_is_never_taken_over() -> None:
    c, _ = await serving()
    allowing(c)
    theirs = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": NAME, "namespace": NS},
        "spec": {"parentRefs": [{"name": "theirs"}]},
    }
    c.api.apply_as("someone", theirs)
    set_spec(c, expose=EXPOSE)
    with pytest.raises(RetryLater):  # theirs may go: looked at again, with backoff (no watch delivers it)
        await c.reconcile()
    assert conditions(c)["Applied"] == ("False", "Conflict")
    assert message(c, "Applied") == (
        f"HTTPRoute {NS}/{NAME} exists and this ServeGraph does not control it; "
        "delete it to let spec.expose create its own"
    )
    assert c.api.httproutes[KEY]["spec"]["parentRefs"] == [{"name": "theirs"}]


async def test_expose_removed_deletes_the_route_and_a_gateways_refusal_is_said() -> None:
    c = await exposed()
    route = c.api.httproutes[KEY]
    route["status"] = {
        "parents": [
            {
                "parentRef": {"namespace": "gateways", "name": "public"},
                "controllerName": "traefik.io/gateway-controller",
                "conditions": [
                    {"type": "Accepted", "status": "False", "reason": "NotAllowedByListeners", "message": "no"}
                ],
            }
        ]
    }
    watch_route(c)
    await c.reconcile()
    assert conditions(c)["Applied"] == ("False", "RouteNotAccepted")
    assert message(c, "Applied") == "Gateway gateways/public did not accept it: NotAllowedByListeners: no"

    c.body["spec"].pop("expose")
    c.body["metadata"]["generation"] += 1
    c.watch_servegraph()
    c.api.calls.clear()
    await c.reconcile()
    assert "delete_httproute" in c.api.writes() and KEY not in c.api.httproutes
    assert ("Normal", "Unexposed", "deleted HTTPRoute mini (spec.expose removed)") in c.api.events
    assert SPEC_HASH_ANNOTATION  # the route's own hash: render/httproute.py
