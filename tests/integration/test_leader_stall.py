"""No split brain (issue 14, item 6), on the real API server with two real operator processes.

The leader reaches the API server through a proxy the test stalls; the standby reaches
it directly. While stalled the leader keeps downloading (the registry is not behind the
proxy) and tries to apply what it downloads. The standby takes the Lease once it has
expired, and writes. Then the proxy lets everything it held through. The audit log,
written by the API server as each request completes, must show no write of the old
leader landing after the standby's first write: the old leader stopped acting, and the
writes it had in flight were dropped with its connections, not delivered late.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from sg_support import OPERATOR_USER, SYSTEM_NS, Kit, bind_leader_election_rbac, sample_bytes, start_operator
from stall_proxy import StallProxy
from support import REGISTRY_TOKEN

from servegraph_testbed import WRITE_VERBS, Component, ControlPlane
from servegraph_testbed.registry import RegistryServer
from servegraph_testbed.waiting import eventually

LEASE = "servegraph-operator-stall"
POLLED = [f"p{i}" for i in range(10)]
"""Created half a second apart and polled every 10 s: the leader downloads and applies about
once a second, so it has writes in flight whenever its connection stalls."""


@pytest.fixture(scope="module")
def election(control_plane: ControlPlane) -> None:
    bind_leader_election_rbac(control_plane, "leader-election-stall")


@pytest.fixture
def proxy(control_plane: ControlPlane) -> Iterator[StallProxy]:
    p = StallProxy("127.0.0.1", control_plane.apiserver_port).start()
    yield p
    p.stop()


@pytest.fixture
async def kit(
    election: None, admin_api: Any, namespace: str, registry: RegistryServer, ca_pem: str
) -> AsyncIterator[Kit]:
    k = Kit(admin_api, namespace, registry, ca_pem)
    await k.secret("registry-token", {"token": REGISTRY_TOKEN})
    await k.secret("registry-ca", {"ca.crt": ca_pem})
    yield k


def _replica(cp: ControlPlane, name: str, kubeconfig: Path | None = None) -> Component:
    env = {"POD_NAME": name}
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    component, _ = start_operator(
        cp,
        name,
        "--leader-elect",
        f"--leader-election-namespace={SYSTEM_NS}",
        f"--leader-election-id={LEASE}",
        env=env,
    )
    return component


async def _holder(coord: Any) -> str | None:
    try:
        lease = await coord.read_namespaced_lease(LEASE, SYSTEM_NS)
    except client.ApiException:
        return None
    return (lease.spec.holder_identity or "").rsplit("_", 1)[0] or None


def _landed_writes(cp: ControlPlane, replica: str, since: int) -> list[dict[str, Any]]:
    """Writes by this replica that the API server completed successfully."""
    events = cp.audit_log.events(user=OPERATOR_USER, verbs=WRITE_VERBS, since=since)
    return [
        e
        for e in events
        if f"({replica}_" in e.get("userAgent", "") and (e.get("responseStatus") or {}).get("code", 0) < 300
    ]


@pytest.mark.timeout(240)
async def test_a_stalled_leader_stops_before_the_standby_writes(
    kit: Kit, control_plane: ControlPlane, proxy: StallProxy, admin_api: Any, tmp_path: Path
) -> None:
    cp = control_plane
    coord = client.CoordinationV1Api(admin_api)
    kubeconfig = proxy.kubeconfig(cp.kubeconfig(OPERATOR_USER), tmp_path / "kubeconfig-proxied.yaml")
    leader = await asyncio.to_thread(_replica, cp, "stall-a", kubeconfig)
    standby: Component | None = None
    flipping = True

    async def flip() -> None:
        """New content every second: every poll downloads something new and applies it."""
        i = 0
        while flipping:
            for sg in POLLED:
                kit.registry.registry.publish(f"{kit.namespace}-{sg}", sample_bytes(("mini", "complete")[i % 2]))
            i += 1
            await asyncio.sleep(1)

    flipper: asyncio.Task[None] | None = None
    try:
        await eventually(lambda: _is(coord, "stall-a"), within=30, what="stall-a to lead")
        standby = await asyncio.to_thread(_replica, cp, "stall-b")
        for sg in POLLED:
            kit.registry.registry.publish(f"{kit.namespace}-{sg}", sample_bytes("mini"))
            await kit.servegraph(sg, f"{kit.namespace}-{sg}", pollInterval="10s")
            await asyncio.sleep(0.5)
        for sg in POLLED:
            await kit.wait_condition(sg, "Applied", "True")
        flipper = asyncio.create_task(flip())
        await asyncio.sleep(12)  # at least one poll each, applied through the proxy
        mark = cp.audit_log.offset()

        proxy.hold()
        stalled = time.monotonic()
        lost = asyncio.create_task(_when_logged(leader, "lost leadership"))
        # What the proxy forwarded before the hold may still land (the API server, starved on a
        # busy machine, can take seconds): "while stalled" starts once the old leader's landed
        # writes stop growing.
        quiet = await _settled(cp, "stall-a", mark)
        await eventually(lambda: _is(coord, "stall-b"), within=60, what="stall-b to take the lease")
        took_over = time.monotonic() - stalled
        assert lost.done(), "the standby holds the lease and the old leader has not stopped"
        stopped = lost.result() - stalled
        await kit.patch_sg(POLLED[0], {"spec": {"rayService": {"image": "example.com/ray:after-takeover"}}})

        async def standby_wrote() -> dict[str, Any] | None:
            writes = _landed_writes(cp, "stall-b", mark)
            return writes[0] if writes else None

        first = await eventually(standby_wrote, within=60, what="the standby's first write")
        held = _landed_writes(cp, "stall-a", quiet)
        assert held == [], "the stalled leader's writes landed while it was stalled"

        proxy.release()  # whatever the old leader left in flight may now arrive
        await asyncio.sleep(8)
        late = [
            (e["verb"], (e.get("objectRef") or {}).get("resource"), e["stageTimestamp"])
            for e in _landed_writes(cp, "stall-a", mark)
            if e["stageTimestamp"] >= first["requestReceivedTimestamp"]
        ]
        print(
            f"old leader stopped {stopped:.1f} s and the standby took over {took_over:.1f} s after the stall; "
            f"the proxy dropped {proxy.dropped} held chunks"
        )
        assert late == [], f"writes of the old leader landed after the standby's first write: {late}"
        assert await _holder(coord) == "stall-b", "the old leader took the lease back"
    finally:
        flipping = False
        if flipper is not None:
            await asyncio.gather(flipper, return_exceptions=True)
        proxy.release()
        cp.unspawn(leader)
        if standby is not None:
            cp.unspawn(standby)
        await kit.custom.delete_collection_namespaced_custom_object(
            "servegraph.io", "v1alpha1", kit.namespace, "servegraphs"
        )


async def _settled(cp: ControlPlane, replica: str, since: int) -> int:
    """An audit-log mark after which none of the replica's in-flight writes are still landing:
    taken once its landed writes since `since` have not grown for 2 s."""
    counts: list[int] = []

    async def unchanged() -> int | None:
        mark = cp.audit_log.offset()
        counts.append(len(_landed_writes(cp, replica, since)))
        return mark if counts[-2:-1] == counts[-1:] else None

    return await eventually(unchanged, within=30, interval=2, what=f"{replica}'s writes to stop landing after the hold")


async def _when_logged(component: Component, text: str) -> float:
    """The monotonic time the test first sees `text` in a replica's log (polled every 50 ms)."""
    while True:
        if text in component.log_path.read_text(errors="replace"):
            return time.monotonic()
        await asyncio.sleep(0.05)


async def _is(coord: Any, name: str) -> bool:
    return await _holder(coord) == name
