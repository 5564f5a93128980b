"""Many tenants, one operator (issue 21, items 3 and 5), against `servegraph run` as a real
process on the real API server, bound by config/rbac only.

What the operator learns at start-up and refuses as a graph source: the API server's real
endpoints (EndpointSlice default/kubernetes, read with the shipped RBAC rule) and its own
pod's addresses (POD_IPS, as the downward API sets it). And the administrator's word on
plain http: without --allow-insecure-http-sources a ServeGraph's allowInsecureHTTP does
nothing; with it, a pinned digest that does not match says nothing of what answered.

The test control plane runs without the API server's endpoint reconciler, so the test
writes the `kubernetes` EndpointSlice as the reconciler would, naming a server of its own
on this machine's non-loopback address (an EndpointSlice may not name loopback).
"""

from __future__ import annotations

import hashlib
import ipaddress
import socket
import ssl
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import trustme
from kubernetes_asyncio import client
from security_support import secured_kit
from sg_support import Kit, bind_operator_rbac, delete_namespace, sample_bytes, start_operator
from support import REGISTRY_TOKEN

from servegraph_testbed import Component, ControlPlane
from servegraph_testbed.registry import Registry, RegistryServer

OWN_POD_IP = "127.0.0.2"  # a loopback address the test can listen on, as POD_IPS names it
SECRET = b"482915"  # what an unauthenticated internal endpoint answers: a 6-digit value


@dataclass
class Tenants:
    """The operator (cluster's API endpoints and own pod learnt) and the servers it must refuse."""

    operator: Component
    namespace: str
    api_endpoint: RegistryServer
    own_pod: RegistryServer
    plain: RegistryServer


def _host_address() -> str:
    """This machine's own non-loopback IPv4 address: the one a route out would use (a UDP
    connect sends nothing). Connections to it stay on this machine."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("8.8.8.8", 53))
        except OSError:
            pytest.fail("the EndpointSlice case needs a non-loopback IPv4 address on this machine")
        address: str = probe.getsockname()[0]
    assert not ipaddress.ip_address(address).is_loopback
    return address


def _slice(address: str, port: int) -> str:
    return f"""
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes
  namespace: default
  labels: {{kubernetes.io/service-name: kubernetes}}
addressType: IPv4
endpoints: [{{addresses: ["{address}"], conditions: {{ready: true}}}}]
ports: [{{name: https, port: {port}, protocol: TCP}}]
"""


@pytest.fixture(scope="module")
async def tenants(control_plane: ControlPlane, admin_api: Any, ca: trustme.CA) -> AsyncIterator[Tenants]:
    own_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(OWN_POD_IP).configure_cert(own_ssl)
    host = _host_address()
    host_ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(host).configure_cert(host_ssl)
    namespace = f"tenants-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(admin_api)
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    async with (
        RegistryServer(Registry(token=REGISTRY_TOKEN), host_ssl, host=host) as api_endpoint,
        RegistryServer(Registry(token=REGISTRY_TOKEN), own_ssl, host=OWN_POD_IP) as own_pod,
        RegistryServer(Registry(token=REGISTRY_TOKEN)) as plain,
    ):
        for server in (api_endpoint, own_pod, plain):
            server.registry.publish("mini", sample_bytes("mini"))
        bind_operator_rbac(control_plane)
        control_plane.kubectl("apply", "-f", "-", stdin=_slice(host, api_endpoint.port))
        try:
            operator, _ = start_operator(
                control_plane, "servegraph-operator-tenants", f"--namespace={namespace}", env={"POD_IPS": OWN_POD_IP}
            )
            try:
                yield Tenants(operator, namespace, api_endpoint, own_pod, plain)
            finally:
                control_plane.unspawn(operator)
        finally:
            control_plane.kubectl("delete", "endpointslice", "kubernetes", "--namespace=default", check=False)
    await delete_namespace(admin_api, namespace)


@pytest.fixture
async def kit(tenants: Tenants, admin_api: Any, ca_pem: str) -> AsyncIterator[Kit]:
    async with secured_kit(admin_api, tenants.namespace, tenants.api_endpoint, ca_pem) as k:
        yield k


def test_the_operator_learnt_the_api_servers_endpoints_and_its_own_pod(tenants: Tenants) -> None:
    log = tenants.operator.log_path.read_text(errors="replace")
    line = next(line for line in log.splitlines() if "graph sources:" in line)
    assert tenants.api_endpoint.base_url.removeprefix("https://") in line, line
    assert f"own pod {OWN_POD_IP}" in line and "plain http refused" in line, line
    assert "cannot read the API server's endpoints" not in log, "the shipped RBAC rule did not suffice"


@pytest.mark.parametrize("target", ["api-endpoint", "own-pod"])
async def test_the_api_servers_endpoints_and_the_operators_own_pod_are_refused(
    kit: Kit, tenants: Tenants, target: str
) -> None:
    """Neither is refused by a default rule (the own pod is loopback, which this operator's
    administrator allows: an exception that must not reach it): only what was learnt refuses them."""
    server = tenants.api_endpoint if target == "api-endpoint" else tenants.own_pod
    await kit.servegraph(target, "mini", url=server.url("mini"))
    cond = await kit.wait_condition(target, "Fetched", "False", "SourceRefused")
    assert "graphs may not be downloaded from" in cond["message"]
    assert server.registry.requests == [], "the operator connected"


async def test_plain_http_is_refused_without_the_administrators_flag(kit: Kit, tenants: Tenants) -> None:
    await kit.servegraph("plain", "mini", url=tenants.plain.url("mini"), allowInsecureHTTP=True)
    cond = await kit.wait_condition("plain", "Fetched", "False", "SourceRefused")
    assert "--allow-insecure-http-sources" in cond["message"]
    assert tenants.plain.registry.requests == [], "the operator connected"
    assert await kit.get_rs("plain") is None


async def test_with_the_flag_a_pinned_http_source_tells_nothing_of_what_answered(
    control_plane: ControlPlane, tenants: Tenants, admin_api: Any, namespace: str, ca_pem: str
) -> None:
    """The administrator allows http: a tenant pins a digest and points at an endpoint
    answering a 6-digit value; the status must not carry its digest or its length."""
    tenants.plain.registry.publish("secret", SECRET)
    operator, _ = start_operator(
        control_plane, "servegraph-operator-http", f"--namespace={namespace}", "--allow-insecure-http-sources"
    )
    try:
        async with secured_kit(admin_api, namespace, tenants.plain, ca_pem) as k:
            await k.servegraph("mini", "mini", url=tenants.plain.url("mini"), allowInsecureHTTP=True)
            fetched = await k.wait_condition("mini", "Fetched", "True", "Downloaded")
            assert (
                fetched["message"] == f"downloaded {len(sample_bytes('mini'))} bytes from {tenants.plain.url('mini')}"
            )

            pin = "0" * 64
            await k.servegraph("probe", "secret", url=tenants.plain.url("secret"), allowInsecureHTTP=True, sha256=pin)
            cond = await k.wait_condition("probe", "Fetched", "False", "DigestMismatch")
            assert (
                cond["message"]
                == f"{tenants.plain.url('secret')} served content that does not match the pinned sha256 {pin}"
            )
            status = str((await k.get_sg("probe"))["status"])
            assert hashlib.sha256(SECRET).hexdigest() not in status and f"{len(SECRET)} bytes" not in status
            assert any(r["name"] == "secret" for r in tenants.plain.registry.requests), "it was downloaded"
    finally:
        control_plane.unspawn(operator)
