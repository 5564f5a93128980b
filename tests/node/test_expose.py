"""`spec.expose` on a real node: the graph answers through Traefik, over TLS terminated at the
Gateway (its certificate from a Secret), to a client outside the pod network (this host, at the
node's address and Traefik's NodePort), and keeps answering across KubeRay's switch to a new
Ray cluster.

The administrator's part is made here as an administrator would: a TLS Secret and the Gateway
`traefik/public` (the one the operator is allowed to attach routes to: node/install.py) with an
HTTPS listener that takes routes from every namespace. The tenant's part is one field of its
ServeGraph.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import trustme
from node_support import TEXT, deploy, figure, mini, servegraph, wait_ready, wait_rolled_out, with_custom_resource

from servegraph_testbed.node.gateway import CONTROLLER_NAME, HTTPS_NODE_PORT, NAMESPACE, PUBLIC_GATEWAY
from servegraph_testbed.node.stack import Stack
from servegraph_testbed.waiting import eventually

pytestmark = pytest.mark.timeout(1800)  # its waits (and the first test's module setup) pass 600 s under load
HOST = "graph.example.test"
SECRET = "public-tls"


@pytest.fixture
async def public_gateway(stack: Stack) -> AsyncIterator[ssl.SSLContext]:
    """The administrator's HTTPS Gateway, its certificate for HOST from a throwaway CA; yields a
    client context trusting that CA only."""
    ca = trustme.CA()
    cert = ca.issue_cert(HOST)
    tls = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": SECRET, "namespace": NAMESPACE},
        "stringData": {
            "tls.crt": "".join(p.bytes().decode() for p in cert.cert_chain_pems),
            "tls.key": cert.private_key_pem.bytes().decode(),
        },
    }
    gateway = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": PUBLIC_GATEWAY, "namespace": NAMESPACE},
        "spec": {
            "gatewayClassName": "traefik",
            "listeners": [
                {
                    "name": "https",
                    "protocol": "HTTPS",
                    "port": 443,
                    "hostname": "*.example.test",
                    "tls": {"mode": "Terminate", "certificateRefs": [{"name": SECRET}]},
                    "allowedRoutes": {"namespaces": {"from": "All"}},
                }
            ],
        },
    }
    for obj in (tls, gateway):
        await asyncio.to_thread(stack.apply, json.dumps(obj))
    client = ssl.create_default_context()
    ca.configure_trust(client)
    yield client
    stack.cp.kubectl("delete", "gateway", PUBLIC_GATEWAY, "-n", NAMESPACE, "--ignore-not-found", check=False)
    stack.cp.kubectl("delete", "secret", SECRET, "-n", NAMESPACE, "--ignore-not-found", check=False)


async def _accepted(stack: Stack, namespace: str, name: str) -> dict[str, Any]:
    """The ServeGraph's HTTPRoute, accepted by Traefik on the Gateway with its backend resolved."""

    async def ready() -> dict[str, Any] | None:
        route = await asyncio.to_thread(stack.get, "httproute", namespace, name)
        if route is None:
            return None
        ours = [p for p in (route.get("status") or {}).get("parents") or [] if p["controllerName"] == CONTROLLER_NAME]
        said = {c["type"]: c["status"] for p in ours for c in p["conditions"]}
        return route if said.get("Accepted") == "True" and said.get("ResolvedRefs") == "True" else None

    return await eventually(ready, within=120, interval=1, what="the HTTPRoute accepted by Traefik")


class TlsLoad:
    """POSTs through the Gateway over TLS back to back, as a client outside the cluster does:
    to the node's address, with the host name in SNI and Host; every outcome recorded."""

    def __init__(self, address: str, path: str, client: ssl.SSLContext) -> None:
        self.url = f"https://{address}:{HTTPS_NODE_PORT}{path}"
        self.client = client
        self.results: list[tuple[float, int, Any]] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def post(self, session: aiohttp.ClientSession, payload: Any) -> tuple[int, Any]:
        async with session.post(
            self.url, json=payload, ssl=self.client, server_hostname=HOST, headers={"Host": HOST}
        ) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text[:300]

    async def __aenter__(self) -> TlsLoad:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task

    async def _run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    status, body = await self.post(session, TEXT)
                except (aiohttp.ClientError, TimeoutError) as e:
                    status, body = 0, repr(e)
                self.results.append((started, status, body))
                await asyncio.sleep(0.05)

    @property
    def failures(self) -> list[tuple[float, int, Any]]:
        return [r for r in self.results if r[1] != 200]


async def test_the_graph_answers_through_the_gateway_over_tls_across_a_new_cluster(
    stack: Stack, namespace: str, public_gateway: ssl.SSLContext
) -> None:
    expose = {"gateway": {"namespace": NAMESPACE, "name": PUBLIC_GATEWAY}, "hostnames": [HOST]}
    registry_name = await deploy(stack, namespace, "mini", mini("1"))
    await asyncio.to_thread(
        stack.cp.kubectl, "patch", "servegraph", "mini", "-n", namespace, "--type", "merge", "-p",
        json.dumps({"spec": {"expose": expose}}),
    )  # fmt: skip
    await wait_ready(stack, namespace, "mini")
    exposed_at = time.monotonic()
    route = await _accepted(stack, namespace, "mini")
    assert route["spec"]["rules"][0]["backendRefs"][0]["name"] == "mini-serve-svc"
    load = TlsLoad(stack.net.node_ip, "/sentiment", public_gateway)

    async def answers() -> tuple[int, Any] | None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            try:
                got = await load.post(session, TEXT)
            except (aiohttp.ClientError, TimeoutError):
                return None
        return got if got[0] == 200 else None

    first = await eventually(answers, within=60, interval=0.5, what="an answer through the Gateway over TLS")
    answered_after = time.monotonic() - exposed_at
    assert first == (200, {"label": "neutral", "score": 0.0}), first

    # The wrong name: the Gateway's certificate does not cover it, and the client says so.
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        async with aiohttp.ClientSession() as session:
            await session.post(load.url, json=TEXT, ssl=public_gateway, server_hostname="other.test")

    async with load:
        await eventually(lambda: _true(len(load.results) >= 10), within=60, interval=0.5, what="10 answers")
        published = time.monotonic()
        v2 = with_custom_resource(mini("2", positive=["fine"]), "2")  # a new Ray cluster
        await stack.publish(registry_name, v2.SerializeToString())
        await stack.post_published_event(registry_name)
        await wait_rolled_out(stack, namespace, "mini", "2", within=600)
        switched = time.monotonic()

        async def positive_since() -> bool:
            return any(at > switched and body == {"label": "positive", "score": 1.0} for at, _, body in load.results)

        await eventually(positive_since, within=60, interval=0.5, what="v2 answering through the Gateway")

    sg = await servegraph(stack, namespace, "mini")
    labels = [body["label"] for _, status, body in load.results if status == 200]
    assert load.failures == [], load.failures[:5]
    assert labels[0] == "neutral" and labels[-1] == "positive", sorted(set(labels))
    assert [c["reason"] for c in sg["status"]["conditions"] if c["type"] == "Applied"] == ["UpToDate"]
    figure(
        f"spec.expose through Traefik over TLS from outside the pod network: first answer {answered_after:.1f} s "
        f"after Ready; a new-cluster publish rolled out in {switched - published:.0f} s with "
        f"{len(load.results)} requests through the Gateway, {len(load.failures)} failed"
    )


async def _true(value: bool) -> bool:
    return value
