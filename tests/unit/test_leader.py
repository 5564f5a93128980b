"""Leader election's timing, against a stand-in Lease API whose answers can be delayed or lost.

The real two-replica takeover, with the leader's API connection stalled by a proxy, is
tests/integration/test_leader_stall.py; here the rule itself, at a tenth of the real timings:
the leader stops acting before a standby could start, whenever its renewals' answers arrive.
"""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

from servegraph.operator.run.leader import LeaderElector, LeaseConfig

CONFIG = LeaseConfig("ns", "lease", "leader_1", lease_s=1.5, renew_deadline_s=1.0, retry_s=0.2)


class Leases:
    """One Lease in memory. `answer_after` delays the answer to the next update (which lands at
    once: a standby sees it); `stalled` makes every later call hang, as a dead connection does."""

    def __init__(self) -> None:
        self.lease: client.V1Lease | None = None
        self.version = 0
        self.answer_after = 0.0
        self.stalled = False
        self.updates: list[float] = []
        """When each update landed (what a standby's expiry counts from)."""

    async def _stall(self) -> None:
        if self.stalled:
            await asyncio.Event().wait()

    async def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> client.V1Lease:
        await self._stall()
        if self.lease is None:
            raise ApiException(status=404)
        return copy.deepcopy(self.lease)

    async def create_namespaced_lease(self, namespace: str, body: dict[str, Any], **_: Any) -> None:
        await self._stall()
        spec = body["spec"]
        self.version += 1
        self.lease = client.V1Lease(
            metadata=client.V1ObjectMeta(name=body["metadata"]["name"], resource_version=str(self.version)),
            spec=client.V1LeaseSpec(
                holder_identity=spec["holderIdentity"],
                lease_duration_seconds=spec["leaseDurationSeconds"],
                renew_time=spec["renewTime"],
                lease_transitions=0,
            ),
        )
        self.updates.append(time.monotonic())

    async def replace_namespaced_lease(self, name: str, namespace: str, body: client.V1Lease, **_: Any) -> None:
        await self._stall()
        assert self.lease is not None
        if body.metadata.resource_version != self.lease.metadata.resource_version:
            raise ApiException(status=409)
        self.version += 1
        self.lease = copy.deepcopy(body)
        self.lease.metadata.resource_version = str(self.version)
        self.updates.append(time.monotonic())
        delay, self.answer_after = self.answer_after, 0.0
        if delay:
            await asyncio.sleep(delay)
            self.stalled = True  # and from then on, nothing gets through


async def test_the_leader_stops_before_a_standby_could_start_however_late_its_renewal_is_answered() -> None:
    """A renewal lands at once (a standby sees it) but its answer comes 0.9 s later, and then
    the connection stalls. Counting from the answer, the leader went on acting past the point
    where a standby takes over; counting from the send, it stops 0.5 s before it."""
    leases = Leases()
    events: list[tuple[str, float]] = []

    async def started() -> None:
        events.append(("started", time.monotonic()))

    async def stopped() -> None:
        events.append(("stopped", time.monotonic()))

    elector = LeaderElector(None, CONFIG, started, stopped, coordination=leases)
    task = asyncio.create_task(elector.run())
    try:
        for _ in range(100):
            if events:
                break
            await asyncio.sleep(0.02)
        assert events and events[0][0] == "started"
        assert elector.leading()
        leases.answer_after = 0.9
        for _ in range(300):
            if events[-1][0] == "stopped":
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    stops = [at for what, at in events if what == "stopped"]
    assert stops, "the leader never stopped"
    last_renewal = leases.updates[-1]  # the renewal whose answer was late: the last one that landed
    standby_may_start = last_renewal + CONFIG.lease_s
    assert stops[0] < standby_may_start, (
        f"the leader acted until {stops[0] - last_renewal:.2f} s after its last renewal landed; "
        f"a standby may start at {CONFIG.lease_s} s"
    )
    # At its renew deadline, not near the lease's end (halfway between: a late timer on a busy machine).
    assert stops[0] <= last_renewal + (CONFIG.renew_deadline_s + CONFIG.lease_s) / 2
    assert not elector.leading()


async def test_leading_is_false_past_the_deadline_even_before_the_loop_notices() -> None:
    """The write fence reads the clock itself: a busy loop cannot extend leadership."""
    leases = Leases()

    async def nothing() -> None:
        return None

    elector = LeaderElector(None, CONFIG, nothing, nothing, coordination=leases)
    task = asyncio.create_task(elector.run())
    try:
        for _ in range(100):
            if elector.leading():
                break
            await asyncio.sleep(0.02)
        assert elector.leading()
        leases.stalled = True
        time.sleep(CONFIG.renew_deadline_s + 0.05)  # noqa: ASYNC251 - the loop blocked, on purpose
        assert elector.is_leader and not elector.leading()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
