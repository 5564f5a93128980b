"""A Lease loss never cuts the events endpoint (issue 44, item 2), on the real API server.

On losing its Lease the operator resets every connection of its workers' API client, so a
write already sent is dropped rather than landing after a standby took over. The events
endpoint used that same client: an event being annotated at that moment lost its write
(`ServerDisconnectedError`) and was answered 202 as if nothing had matched. The endpoint has
its own client now (any replica, leader or not, serves events), and what it could not
annotate it answers 503, so the sender sends the event again.

The operator runs in this process, through a proxy that holds its traffic: the annotation is
in flight when the workers' connections are reset (`Operator.stop_workers`, what the elector
calls on a Lease loss), then the proxy lets it through.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cloudevents.core.bindings.http import to_binary_event
from cloudevents.core.v1.event import CloudEvent
from kubernetes_asyncio import client
from sg_support import GROUP, OPERATOR_USER, PLURAL, SYSTEM_NS, VERSION, Kit, bind_leader_election_rbac
from stall_proxy import StallProxy

from servegraph.names import REFRESH_ANNOTATION
from servegraph.operator.cache import SERVEGRAPHS
from servegraph.operator.run.app import Options, start
from servegraph.operator.secrets import SecretKeyRef
from servegraph_testbed import ControlPlane
from servegraph_testbed.registry import RegistryServer
from servegraph_testbed.waiting import eventually

TOKEN = "lease-loss-events-token"
LEASE = "servegraph-events-lease-loss"


@pytest.fixture
def proxy(control_plane: ControlPlane) -> Iterator[StallProxy]:
    p = StallProxy("127.0.0.1", control_plane.apiserver_port).start()
    yield p
    p.stop()


def _setup(cp: ControlPlane) -> None:
    """config/rbac for the operator, its events token, and a Lease someone else holds for an
    hour: the operator in this test never leads, its workers never run."""
    bind_leader_election_rbac(cp, "leader-election-lease-loss")
    token = base64.b64encode(TOKEN.encode()).decode()
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    cp.kubectl(
        "apply", "-f", "-",
        stdin=f"apiVersion: v1\nkind: Secret\nmetadata: {{name: lease-loss-events, namespace: {SYSTEM_NS}}}\n"
        f"data: {{token: {token}}}\n---\n"
        f"apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {{name: {LEASE}, namespace: {SYSTEM_NS}}}\n"
        f"spec: {{holderIdentity: someone-else, leaseDurationSeconds: 3600, renewTime: '{now}'}}\n",
    )  # fmt: skip


async def _post(port: int, event_id: str, subject: str) -> tuple[int, Any]:
    event = CloudEvent(
        attributes={"type": "io.servegraph.graph.published", "source": "https://r", "id": event_id, "subject": subject}
    )
    message = to_binary_event(event)
    headers = {**message.headers, "Authorization": f"Bearer {TOKEN}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://127.0.0.1:{port}/v1/events", headers=headers, data=message.body) as answer,
    ):
        return answer.status, await answer.json()


@pytest.mark.timeout(120)
async def test_an_event_in_flight_when_the_lease_is_lost_is_still_refreshed(
    control_plane: ControlPlane,
    admin_api: Any,
    namespace: str,
    registry: RegistryServer,
    ca_pem: str,
    proxy: StallProxy,
    tmp_path: Path,
) -> None:
    await asyncio.to_thread(_setup, control_plane)
    kit = Kit(admin_api, namespace, registry, ca_pem)
    sg = await kit.servegraph("published", "tenant-graph")
    kubeconfig = proxy.kubeconfig(control_plane.kubeconfig(OPERATOR_USER), tmp_path / "kubeconfig-proxied.yaml")
    options = Options(
        kubeconfig=str(kubeconfig),
        health_host="127.0.0.1",
        health_port=0,
        leader_elect=True,
        lease_namespace=SYSTEM_NS,
        lease_name=LEASE,
        events_host="127.0.0.1",
        events_port=0,
        events_token_secret=SecretKeyRef(SYSTEM_NS, "lease-loss-events", "token"),
        parse_workers=1,
    )
    operator = await start(options)
    try:
        mark = operator.reconciler.listing()  # what the watch's first list and delivery would do
        operator.reconciler.relisted(SERVEGRAPHS, None, {(namespace, "published")}, mark)
        operator.reconciler.servegraph_changed(sg)
        assert operator.workers == [], "the Lease is someone else's: no reconcile runs here"

        proxy.hold()
        held = proxy.held
        answer = asyncio.create_task(_post(operator.ports["events"], "published-1", kit.registry.url("tenant-graph")))
        await eventually(lambda: _now(proxy.held > held), within=10, interval=0.02, what="the annotation in flight")
        reset = time.monotonic()
        await operator.stop_workers()  # what the elector does when the Lease is lost
        proxy.release()
        status, body = await asyncio.wait_for(answer, timeout=30)
        print(f"event answered {status} {time.monotonic() - reset:.2f} s after the workers' connections were reset")
        assert (status, body) == (202, {"refreshed": [f"{namespace}/published"]})
        annotations = (await kit.get_sg("published"))["metadata"].get("annotations") or {}
        assert annotations.get(REFRESH_ANNOTATION) == "published-1"
    finally:
        proxy.release()
        await operator.stop()
        await client.CustomObjectsApi(admin_api).delete_collection_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL
        )


async def _now(value: bool) -> bool:
    return value
