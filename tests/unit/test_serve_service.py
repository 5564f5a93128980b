"""spec.rayService.serveService (issue 21, case 4): a graph needs a ClusterIP Service; what else
a Service can do (external IPs, node ports, load balancers) is refused by name, unless the
administrator allows the type."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from reconcile_support import KEY, Cluster

from servegraph.operator import serve_service
from servegraph.operator.spec import SpecError, parse_spec

FIELD = "spec.rayService.serveService"


def _spec(serve: Any) -> dict[str, Any]:
    return {"source": {"url": "https://r/x", "tokenSecretRef": {"name": "t"}}, "rayService": {"serveService": serve}}


ALLOWED = {
    "metadata": {"name": "graph-serve", "labels": {"team": "a"}, "annotations": {"note": "x"}},
    "spec": {
        "type": "ClusterIP",
        "ports": [{"name": "serve", "port": 8000, "targetPort": 8000, "protocol": "TCP"}],
        "sessionAffinity": "ClientIP",
        "ipFamilyPolicy": "SingleStack",
    },
}


def test_a_clusterip_template_is_accepted_and_rendered() -> None:
    spec = parse_spec(_spec(ALLOWED), "team-a")
    assert spec.rayservice_options("sg", "team-a", {}).serve_service == ALLOWED
    assert serve_service.check({}) == []


@pytest.mark.parametrize(
    ("serve", "expected"),
    [
        ({"spec": {"externalIPs": ["10.0.0.1"]}}, f"{FIELD}.spec.externalIPs: not allowed (external IPs let"),
        ({"spec": {"type": "NodePort"}}, f"{FIELD}.spec.type: 'NodePort' is not allowed (allowed: ClusterIP;"),
        ({"spec": {"type": "LoadBalancer"}}, f"{FIELD}.spec.type: 'LoadBalancer' is not allowed"),
        ({"spec": {"type": "ExternalName", "externalName": "x.test"}}, f"{FIELD}.spec.externalName: not allowed"),
        ({"spec": {"ports": [{"name": "serve", "port": 80, "nodePort": 30080}]}}, f"{FIELD}.spec.ports[0].nodePort"),
        ({"spec": {"loadBalancerIP": "1.2.3.4"}}, f"{FIELD}.spec.loadBalancerIP: not allowed (only with type Load"),
        ({"spec": {"loadBalancerSourceRanges": ["0.0.0.0/0"]}}, f"{FIELD}.spec.loadBalancerSourceRanges"),
        ({"spec": {"externalTrafficPolicy": "Local"}}, f"{FIELD}.spec.externalTrafficPolicy: not allowed"),
        ({"spec": {"clusterIP": "10.96.0.10"}}, f"{FIELD}.spec.clusterIP: not allowed"),
        ({"spec": {"selector": {"app": "other"}}}, f"{FIELD}.spec.selector: not allowed (KubeRay selects"),
        ({"metadata": {"namespace": "kube-system"}}, f"{FIELD}.metadata.namespace: not allowed"),
        ({"spec": {"type": ["ClusterIP"]}}, f"{FIELD}.spec.type: ['ClusterIP'] is not allowed"),
        ({"spec": "NodePort"}, f"{FIELD}.spec: must be an object"),
        ("NodePort", f"{FIELD}: must be an object"),
    ],
    ids=[
        "external-ips",
        "node-port-type",
        "load-balancer-type",
        "external-name",
        "node-port",
        "load-balancer-ip",
        "source-ranges",
        "traffic-policy",
        "cluster-ip",
        "selector",
        "namespace",
        "type-not-a-string",
        "spec-not-an-object",
        "not-an-object",
    ],
)
def test_what_a_graph_does_not_need_is_refused_by_name(serve: Any, expected: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(_spec(serve), "team-a")
    assert expected in str(err.value)


def test_the_administrator_can_allow_node_ports_and_load_balancers_but_never_external_ips() -> None:
    node_port = {"spec": {"type": "NodePort", "ports": [{"name": "serve", "port": 8000, "nodePort": 30080}]}}
    parse_spec(_spec(node_port), "team-a", serve_service_types={"NodePort"})
    lb = {
        "spec": {"type": "LoadBalancer", "loadBalancerSourceRanges": ["10.0.0.0/8"], "externalTrafficPolicy": "Local"}
    }
    with pytest.raises(SpecError, match=r"'LoadBalancer' is not allowed \(allowed: ClusterIP, NodePort;"):
        parse_spec(_spec(lb), "team-a", serve_service_types={"NodePort"})
    parse_spec(_spec(lb), "team-a", serve_service_types=serve_service.WIDENING)
    # LoadBalancer fields only with that type, external IPs never
    with pytest.raises(SpecError, match=r"spec\.loadBalancerSourceRanges: not allowed \(only with type LoadBalancer"):
        parse_spec(_spec({"spec": {"type": "NodePort", "loadBalancerSourceRanges": []}}), "t", {"NodePort"})
    with pytest.raises(SpecError, match=r"spec\.externalIPs: not allowed"):
        parse_spec(_spec({"spec": {"type": "LoadBalancer", "externalIPs": ["1.1.1.1"]}}), "t", serve_service.WIDENING)


def test_the_flag_allows_only_node_port_and_load_balancer() -> None:
    assert serve_service.parse_types("") == frozenset()
    assert serve_service.parse_types("NodePort, LoadBalancer,ClusterIP") == {"NodePort", "LoadBalancer"}
    with pytest.raises(ValueError, match="ExternalName cannot be allowed"):
        serve_service.parse_types("NodePort,ExternalName")


async def test_a_running_graph_keeps_its_rayservice_when_the_tenant_asks_for_external_ips() -> None:
    """Before: the template was copied into the RayService as it was, and KubeRay made the Service."""
    c = Cluster()
    await c.started()
    assert "serveService" not in c.api.rayservices[KEY]["spec"]
    c.body["spec"]["rayService"] = {"serveService": {"spec": {"externalIPs": ["8.8.8.8"], "type": "ClusterIP"}}}
    c.body["metadata"]["generation"] = 2
    c.watch_servegraph()
    await c.reconcile()
    assert "serveService" not in c.api.rayservices[KEY]["spec"]
    assert c.condition("Fetched") == ("False", "InvalidSpec")
    message = next(x for x in c.body["status"]["conditions"] if x["type"] == "Fetched")["message"]
    assert message.startswith(f"{FIELD}.spec.externalIPs: not allowed")


async def test_an_allowed_node_port_reaches_the_rayservice() -> None:
    c = Cluster()
    c.reconciler.serve_service_types = frozenset({"NodePort"})
    template = {"spec": {"type": "NodePort", "ports": [{"name": "serve", "port": 8000, "nodePort": 30080}]}}
    c.body["spec"]["rayService"] = {"serveService": template}
    await c.started()
    stored = c.api.rayservices[KEY]["spec"]["serveService"]  # as stored: the schema defaults the protocol
    assert stored == {"spec": {**template["spec"], "ports": [{**template["spec"]["ports"][0], "protocol": "TCP"}]}}


# -- issue 45, item 9: annotations, which controllers act on, only under the administrator's prefixes --

EXPOSING = {
    "tailscale.com/expose": "true",
    "external-dns.alpha.kubernetes.io/hostname": "graph.example.com",
    "service.cilium.io/global": "true",
}


def test_annotations_are_refused_unless_the_administrator_allows_their_prefix() -> None:
    serve = {"metadata": {"annotations": {**EXPOSING, "prometheus.io/scrape": "true"}}}
    with pytest.raises(SpecError) as err:
        parse_spec(_spec(serve), "team-a", serve_service_annotations=("prometheus.io/",))
    problems = str(err.value)
    for key in EXPOSING:
        assert f"{FIELD}.metadata.annotations[{key!r}]: not allowed (controllers act on annotations; " in problems
    assert "the prefixes allowed: prometheus.io/, the operator's --allow-serve-service-annotations" in problems
    assert "prometheus.io/scrape" not in problems
    allowed = {"metadata": {"annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8000"}}}
    parse_spec(_spec(allowed), "team-a", serve_service_annotations=("prometheus.io/",))
    with pytest.raises(SpecError, match=r"the prefixes allowed: none"):
        parse_spec(_spec(allowed), "team-a", serve_service_annotations=())
    with pytest.raises(SpecError, match=r"metadata\.annotations: must be an object"):
        parse_spec(_spec({"metadata": {"annotations": ["x"]}}), "team-a", serve_service_annotations=())
    parse_spec(_spec(serve), "team-a")  # `servegraph diff` and `render` check no annotation (no flags)


def test_the_annotations_flag_takes_prefixes_and_nothing_that_allows_everything() -> None:
    assert serve_service.parse_annotation_prefixes("") == ()
    assert serve_service.parse_annotation_prefixes(" prometheus.io/, example.com/team-,prometheus.io/") == (
        "example.com/team-",
        "prometheus.io/",
    )
    for bad in ("*", "/", "-x", "a b"):
        with pytest.raises(ValueError, match="is no annotation key prefix"):
            serve_service.parse_annotation_prefixes(bad)


async def test_the_operator_refuses_an_exposing_annotation_and_the_running_graph_keeps_its_rayservice() -> None:
    c = Cluster()
    await c.started()
    c.body["spec"]["rayService"] = {"serveService": {"metadata": {"annotations": {"tailscale.com/expose": "true"}}}}
    c.body["metadata"]["generation"] = 2
    c.watch_servegraph()
    await c.reconcile()
    assert "serveService" not in c.api.rayservices[KEY]["spec"]  # by default no prefix is allowed
    assert c.condition("Fetched") == ("False", "InvalidSpec")
    c.reconciler.serve_service_annotations = ("tailscale.com/",)  # the administrator's word
    c.body["metadata"]["generation"] = 3
    c.watch_servegraph()
    await c.reconcile()
    assert c.api.rayservices[KEY]["spec"]["serveService"]["metadata"]["annotations"] == {"tailscale.com/expose": "true"}


def test_servegraph_run_takes_the_annotation_prefixes_and_refuses_a_glob() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "servegraph.cli", "run", "--allow-serve-service-annotations=prometheus.io/,*"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "--allow-serve-service-annotations: '*' is no annotation key prefix" in done.stderr, done.stderr
