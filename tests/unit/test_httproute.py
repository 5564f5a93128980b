"""`spec.expose`'s HTTPRoute as rendered (render/httproute.py): within the Gateway API's bounds, the
serve Service KubeRay makes, byte-stable, and only fields the Gateway API's CRD declares (the
API server's own checks, CEL included, in tests/integration/test_expose.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
import yaml
from test_samples import _closed

from servegraph.names import SPEC_HASH_ANNOTATION
from servegraph.render.httproute import MAX_RULES, RouteError, RouteOptions, render_httproute, serve_service
from servegraph_testbed import find_manifests

OPTIONS = RouteOptions(
    name="g", namespace="team-a", gateway_namespace="gateways", gateway_name="public", service="g-serve-svc"
)


def test_applications_on_their_own_prefixes_share_one_rule_and_each_rewritten_one_has_its_own() -> None:
    prefixes = {"b": "/b", "a": "/a", "c": "/"}
    route = render_httproute(prefixes, replace(OPTIONS, paths={"b": "/v2/b"}))
    rules = route["spec"]["rules"]
    assert [m["path"]["value"] for m in rules[0]["matches"]] == ["/a", "/"], "by application name"
    assert rules[1]["matches"] == [{"path": {"type": "PathPrefix", "value": "/v2/b"}}]
    assert rules[1]["filters"][0]["urlRewrite"]["path"] == {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/b"}
    assert all(r["backendRefs"] == [{"name": "g-serve-svc", "port": 8000}] for r in rules)
    assert render_httproute(dict(reversed(prefixes.items())), OPTIONS) == render_httproute(prefixes, OPTIONS)


def test_more_rules_than_an_httproute_holds_are_refused_naming_why() -> None:
    prefixes = {f"a{i}": f"/a{i}" for i in range(MAX_RULES + 1)}
    paths = {app: f"/x{p}" for app, p in prefixes.items()}
    with pytest.raises(RouteError, match="17 rules, over the 16 an HTTPRoute may hold"):
        render_httproute(prefixes, replace(OPTIONS, paths=paths))
    assert len(render_httproute({f"a{i}": f"/a{i}" for i in range(200)}, OPTIONS)["spec"]["rules"]) == 4


def test_the_serve_service_is_kuberays_or_the_templates() -> None:
    assert serve_service("g", None) == ("g-serve-svc", 8000)
    template = {"metadata": {"name": "front"}, "spec": {"ports": [{"name": "serve", "port": 9000}]}}
    assert serve_service("g", template) == ("front", 9000)


def test_a_change_of_what_is_rendered_changes_its_hash() -> None:
    one = render_httproute({"a": "/a"}, OPTIONS)
    other = render_httproute({"a": "/a"}, replace(OPTIONS, hostnames=("x.example.test",)))
    assert (
        one["metadata"]["annotations"][SPEC_HASH_ANNOTATION] != other["metadata"]["annotations"][SPEC_HASH_ANNOTATION]
    )


def test_the_route_passes_the_gateway_apis_schema() -> None:
    crd_file = Path(find_manifests().gateway_crds) / "gateway.networking.k8s.io_httproutes.yaml"
    crd = yaml.safe_load(crd_file.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    options = replace(
        OPTIONS,
        section_name="https",
        hostnames=("graph.example.test", "*.example.test"),
        paths={"b": "/v2/b"},
        owner_references=({"apiVersion": "servegraph.io/v1alpha1", "kind": "ServeGraph", "name": "g", "uid": "u"},),
    )
    route = render_httproute({"a": "/a", "b": "/b"}, options)
    jsonschema.Draft7Validator(_closed(version["schema"]["openAPIV3Schema"])).validate(route)
