"""Running it in production: Lease leader election across two real operator
processes, the "graph published" CloudEvents endpoint end to end, and the
source-host guard, on the real control plane."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from cloudevents.core.bindings.http import HTTPMessage, to_binary_event, to_structured_event
from cloudevents.core.v1.event import CloudEvent
from kubernetes_asyncio import client
from sg_support import OPERATOR_USER, SYSTEM_NS, Kit, bind_leader_election_rbac, sample_bytes, start_operator
from support import REGISTRY_TOKEN, SAMPLES

from servegraph.graph import load_graph
from servegraph.render import serve_config_yaml
from servegraph_testbed import WRITE_VERBS, Component, ControlPlane
from servegraph_testbed.registry import RegistryServer
from servegraph_testbed.waiting import eventually

EVENTS_TOKEN = "ev3nts-t0ken-0f-the-test"
LEASE = "servegraph-operator-test"


@dataclass
class Replica:
    name: str
    component: Component
    health_port: int
    events_port: int


def _start(cp: ControlPlane, name: str, events_port: int) -> Replica:
    component, health = start_operator(
        cp,
        name,
        "--leader-elect",
        f"--leader-election-namespace={SYSTEM_NS}",
        f"--leader-election-id={LEASE}",
        f"--events-address=127.0.0.1:{events_port}",
        f"--events-token-secret={SYSTEM_NS}/events-token",
        "--allowed-source-hosts=127.0.0.1,*.example.com",
        env={"POD_NAME": name},
    )
    return Replica(name, component, health, events_port)


@pytest.fixture(scope="module")
def replicas(control_plane: ControlPlane) -> Iterator[dict[str, Replica]]:
    """Two operator replicas with leader election, as the shipped manifests run them."""
    from servegraph_testbed.processes import free_port

    bind_leader_election_rbac(control_plane, "leader-election-test")
    token = base64.b64encode(EVENTS_TOKEN.encode()).decode()
    control_plane.kubectl(
        "apply", "-f", "-",
        stdin=f"apiVersion: v1\nkind: Secret\nmetadata: {{name: events-token, namespace: {SYSTEM_NS}}}\ndata: {{token: {token}}}\n",
    )  # fmt: skip
    started: dict[str, Replica] = {}
    try:
        started["a"] = _start(control_plane, "op-a", free_port())
        # a is leader before b starts, so the test knows whom to kill
        eventually_sync(lambda: _holder(control_plane) == "op-a", 30, "op-a to take the lease")
        started["b"] = _start(control_plane, "op-b", free_port())
        yield started
    finally:
        for replica in started.values():
            control_plane.unspawn(replica.component)


def eventually_sync(check: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {within:.0f} s")
        time.sleep(0.2)


def _holder(cp: ControlPlane) -> str | None:
    """The POD_NAME of the Lease holder (identities are `<pod>_<per-process suffix>`)."""
    out = cp.kubectl("get", "lease", LEASE, "-n", SYSTEM_NS, "-o", "jsonpath={.spec.holderIdentity}", check=False)
    holder = out.stdout.strip() if out.returncode == 0 else ""
    return holder.rsplit("_", 1)[0] or None


@pytest.fixture
async def kit(
    replicas: dict[str, Replica], admin_api: Any, namespace: str, registry: RegistryServer, ca_pem: str
) -> AsyncIterator[Kit]:
    k = Kit(admin_api, namespace, registry, ca_pem)
    await k.secret("registry-token", {"token": REGISTRY_TOKEN})
    await k.secret("registry-ca", {"ca.crt": ca_pem})
    yield k


def _writes_by(cp: ControlPlane, replica: str, since: int) -> list[dict[str, Any]]:
    events = cp.audit_log.events(user=OPERATOR_USER, verbs=WRITE_VERBS, since=since)
    return [e for e in events if f"({replica}_" in e.get("userAgent", "")]


async def _post(
    port: int, message: HTTPMessage | None, token: str | None, body: bytes | None = None
) -> tuple[int, Any]:
    headers = dict(message.headers) if message else {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"http://127.0.0.1:{port}/v1/events", headers=headers, data=body if body is not None else message.body
        ) as resp,  # type: ignore[union-attr]
    ):
        return resp.status, await resp.json()


def _published(
    subject: str | None = None, data: dict[str, Any] | None = None, type_: str = "io.servegraph.graph.published"
) -> CloudEvent:
    attributes = {"type": type_, "source": "https://registry.example.com", "id": f"ev-{time.monotonic_ns()}"}
    if subject:
        attributes["subject"] = subject
    return CloudEvent(attributes=attributes, data=data)


async def test_only_the_leader_writes_and_a_standby_takes_over(
    kit: Kit, replicas: dict[str, Replica], control_plane: ControlPlane
) -> None:
    mark = control_plane.audit_log.offset()
    kit.registry.registry.publish("mini", sample_bytes("mini"))
    await kit.servegraph("first", "mini")
    await kit.wait_condition("first", "Applied", "True")
    assert _writes_by(control_plane, "op-a", mark), "the leader applied the RayService"
    assert _writes_by(control_plane, "op-b", mark) == [], "the standby wrote something"

    os.killpg(replicas["a"].component.pid or 0, signal.SIGKILL)
    killed = time.monotonic()
    await kit.servegraph("second", "mini")  # pending work while nobody leads
    await kit.wait_rs("second", within=45)
    takeover = time.monotonic() - killed
    assert _holder(control_plane) == "op-b"
    print(f"takeover + pending reconcile: {takeover:.1f} s after SIGKILL")
    assert takeover < 30

    items = (await kit.custom.list_namespaced_custom_object("ray.io", "v1", kit.namespace, "rayservices"))["items"]
    owners = sorted(i["metadata"]["ownerReferences"][0]["name"] for i in items)
    assert owners == ["first", "second"], "no RayService lost or duplicated"


async def test_graph_published_event_refreshes_end_to_end(kit: Kit, replicas: dict[str, Replica]) -> None:
    port = _leader(replicas).events_port
    kit.registry.registry.publish("mini", sample_bytes("mini"))
    sg = await kit.servegraph("evt", "mini")
    await kit.wait_condition("evt", "Applied", "True")
    kit.registry.registry.publish("mini", sample_bytes("complete"))

    status, body = await _post(port, to_binary_event(_published(subject=kit.registry.url("mini"))), EVENTS_TOKEN)
    assert status == 202, body
    assert f"{kit.namespace}/evt" in body["refreshed"]
    complete = serve_config_yaml(load_graph(SAMPLES / "complete.pb"))
    await kit.wait_rs("evt", lambda r: r["spec"]["serveConfigV2"] == complete)

    await kit.patch_sg("evt", {"metadata": {"labels": {"team": "search"}}})
    kit.registry.registry.publish("mini", sample_bytes("heterogeneous"))

    async def post_structured() -> Any:
        # the endpoint matches against the watch cache, which sees the new label a moment later
        status, body = await _post(
            port, to_structured_event(_published(data={"labelSelector": "team=search"})), EVENTS_TOKEN
        )
        assert status == 202, body
        return f"{kit.namespace}/evt" in body["refreshed"]

    await eventually(post_structured, within=30, what="a structured event matching the label")
    hetero = serve_config_yaml(load_graph(SAMPLES / "heterogeneous.pb"))
    await kit.wait_rs("evt", lambda r: r["spec"]["serveConfigV2"] == hetero)
    assert sg["metadata"]["uid"] == (await kit.get_sg("evt"))["metadata"]["uid"]


async def test_events_endpoint_refuses_bad_requests(replicas: dict[str, Replica]) -> None:
    port = _leader(replicas).events_port
    good = to_binary_event(_published(subject="https://registry.example.com/v1/graphs/none"))
    assert (await _post(port, good, None))[0] == 401
    assert (await _post(port, good, "wrong"))[0] == 403
    status, body = await _post(port, to_binary_event(_published(subject="x", type_="com.example.other")), EVENTS_TOKEN)
    assert status == 400 and "unsupported event type" in body["error"]
    status, body = await _post(port, None, EVENTS_TOKEN, body=b'{"specversion": "1.0"}')
    assert status == 400 and "not a CloudEvent" in body["error"]
    status, body = await _post(port, to_binary_event(_published()), EVENTS_TOKEN)
    assert status == 400 and "subject" in body["error"]
    status, _ = await _post(port, None, EVENTS_TOKEN, body=b"x" * (65 * 1024))
    assert status == 413
    # 60 at once (a burst of 20, then 5 a second): sent one by one, a starved machine could
    # space them past the refill and see no 429.
    statuses = [status for status, _ in await asyncio.gather(*(_post(port, good, EVENTS_TOKEN) for _ in range(60)))]
    assert 429 in statuses, "the endpoint is rate-limited"


@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        (
            "https://169.254.169.254/latest/meta-data",
            "is, or resolves to, an address graphs may not be downloaded from",
        ),
        ("https://localhost:1/v1/graphs/x", "host localhost is not in the allowed source hosts"),
    ],
    ids=["metadata-address", "not-allowlisted"],
)
async def test_source_host_guard(kit: Kit, url: str, fragment: str) -> None:
    await kit.servegraph("guarded", "x", url=url)
    cond = await kit.wait_condition("guarded", "Fetched", "False", "SourceRefused")
    assert fragment in cond["message"]
    assert await kit.get_rs("guarded") is None


def _leader(replicas: dict[str, Replica]) -> Replica:
    alive = [r for r in replicas.values() if r.component.running]
    return alive[0]


async def test_lease_is_released_on_clean_shutdown(
    control_plane: ControlPlane, replicas: dict[str, Replica], admin_api: Any
) -> None:
    from servegraph_testbed.processes import free_port

    coord = client.CoordinationV1Api(admin_api)
    standby = _start(control_plane, "op-c", free_port())
    try:
        holder = _holder(control_plane)
        current = next(r for r in replicas.values() if r.name == holder)
        start = time.monotonic()
        control_plane.unspawn(current.component)  # SIGTERM: releases the lease
        await eventually(
            lambda: _async(_holder(control_plane) not in (None, holder)), within=15, what="handover after SIGTERM"
        )
        assert time.monotonic() - start < 10, "a released lease is taken without waiting for expiry"
        lease = await coord.read_namespaced_lease(LEASE, SYSTEM_NS)
        assert lease.spec.lease_transitions >= 2
    finally:
        control_plane.unspawn(standby.component)


async def _async(value: Any) -> Any:
    await asyncio.sleep(0)
    return value


def test_no_exception_leaks(replicas: dict[str, Replica]) -> None:
    for replica in replicas.values():
        log = replica.component.log_path.read_text(errors="replace")
        assert EVENTS_TOKEN not in log and REGISTRY_TOKEN not in log
        assert "Traceback" not in log, replica.component.log_tail()
