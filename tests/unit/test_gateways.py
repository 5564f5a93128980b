"""The administrator's allowlist of Gateways and gateway classes (operator/gateways.py): its flags
read, a bad entry refused by name, what it allows. Through the reconciler:
tests/unit/test_reconcile_expose.py; `servegraph run` refusing a bad flag: below."""

from __future__ import annotations

import subprocess
import sys

import pytest

from servegraph.operator.gateways import GatewayFlagError, GatewayPolicy, parse_classes, parse_gateways


def test_the_flags_read_names_and_namespace_wildcards() -> None:
    assert parse_classes(" traefik, istio ,") == {"traefik", "istio"}
    assert parse_gateways("gateways/public, shared/*") == {("gateways", "public"), ("shared", "*")}
    assert parse_classes("") == frozenset() and parse_gateways("") == frozenset()


@pytest.mark.parametrize(
    ("flag", "text", "error"),
    [
        ("classes", "Traefik", "--allow-gateway-classes: Traefik is not a GatewayClass name"),
        ("gateways", "public", "--allow-gateways: 'public' is not namespace/name (or namespace/*)"),
        ("gateways", "*/public", "--allow-gateways: '*/public' is not namespace/name (or namespace/*)"),
        ("gateways", "a/b/c", "--allow-gateways: 'a/b/c' is not namespace/name (or namespace/*)"),
    ],
)
def test_a_bad_entry_is_refused_by_name(flag: str, text: str, error: str) -> None:
    with pytest.raises(GatewayFlagError) as err:
        (parse_classes if flag == "classes" else parse_gateways)(text)
    assert str(err.value) == error


def test_a_wildcard_allows_its_namespace_only() -> None:
    policy = GatewayPolicy(frozenset(), frozenset({("shared", "*"), ("gateways", "public")}))
    assert policy.allows_gateway("shared", "anything") and policy.allows_gateway("gateways", "public")
    assert not policy.allows_gateway("gateways", "internal") and not policy.allows_gateway("other", "public")
    assert policy.describe() == "gateway classes none; Gateways gateways/public, shared/*"


def test_servegraph_run_refuses_a_bad_flag_before_it_connects() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "servegraph.cli", "run", "--allow-gateways", "public", "--kubeconfig", "/nonexistent"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode != 0
    assert "servegraph run: --allow-gateways: 'public' is not namespace/name (or namespace/*)" in out.stderr
