"""Leader election on a coordination.k8s.io/v1 Lease, the way client-go does it.

kopf's peering is a hot-standby by priority, not a lease: with two replicas of
equal priority both freeze. This elector decides who reconciles; every replica
keeps watching (warm caches), so a takeover starts with the work already known.

Timing (client-go's defaults): the lease lasts 15 s, the leader must renew
within 10 s or stop leading at once, and everyone retries every 2 s. Expiry is
judged by the local clock from when this process last saw the record change,
never by comparing timestamps written by another machine.

Why the leader always stops first: a standby takes over no sooner than 15 s after
it saw the leader's last renewal land, which is after the leader sent it. The
leader counts its 10 s renew deadline from when it *sent* that renewal (not from
when the answer came back), as one deadline over all the tries in between (each
try waits only for what is left of it), and when the deadline passes it stops at
once: no new write passes `leading()` (the API client's fence), every connection
to the API server is reset so that a write stuck in the network is dropped, and
the reconcile workers are cancelled. So every write of an old leader has landed,
or never will, at least 5 s before a standby can start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.rest import ApiException

log = logging.getLogger("servegraph.operator.run.leader")


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    lease_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_s: float = 2.0


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Calls `on_started` when this process becomes leader and `on_stopped` when it
    stops being one (renewal failed past the deadline, or shutdown)."""

    def __init__(
        self,
        api: client.ApiClient,
        config: LeaseConfig,
        on_started: Callable[[], Awaitable[None]],
        on_stopped: Callable[[], Awaitable[None]],
        coordination: Any = None,
    ) -> None:
        """`coordination` replaces the coordination.k8s.io client (a test's stand-in)."""
        self._api = coordination or client.CoordinationV1Api(api)
        self.config = config
        self._on_started = on_started
        self._on_stopped = on_stopped
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._deadline = 0.0
        """Monotonic time when leading ends: the last renewal's send time + the renew deadline."""
        self.is_leader = False

    def leading(self) -> bool:
        """Whether this process may act now: the fence every write of the operator passes."""
        return self.is_leader and time.monotonic() < self._deadline

    async def run(self) -> None:
        """Forever: acquire, then renew until it fails; release on cancellation."""
        try:
            while True:
                await self._acquire()
                await self._renew_until_lost()
        finally:
            if self.is_leader:
                self.is_leader = False
                await self._on_stopped()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.shield(self._release()), timeout=self.config.retry_s)

    async def _acquire(self) -> None:
        cfg = self.config
        while True:
            sent = time.monotonic()
            attempt, answered = await self._attempt(cfg.renew_deadline_s)
            if not answered:
                await _drop(attempt)
            acquired = answered and attempt.result()
            if acquired and time.monotonic() < sent + cfg.renew_deadline_s:
                break
            await asyncio.sleep(cfg.retry_s)
        self._deadline = sent + cfg.renew_deadline_s
        self.is_leader = True
        log.info("became leader (lease %s/%s, identity %s)", cfg.namespace, cfg.name, cfg.identity)
        await self._on_started()

    async def _renew_until_lost(self) -> None:
        cfg = self.config
        while True:
            left = self._deadline - time.monotonic()
            if left <= 0:
                return await self._lose("the renew deadline passed")
            await asyncio.sleep(min(cfg.retry_s, left))
            sent = time.monotonic()
            if sent >= self._deadline:
                return await self._lose("the renew deadline passed")
            attempt, answered = await self._attempt(self._deadline - sent)
            if not answered:
                # Stop first (which resets the connections, dropping this renewal too), then let go of it.
                await self._lose("no renewal was answered before the renew deadline")
                await _drop(attempt)
                return None
            if attempt.result():
                self._deadline = sent + cfg.renew_deadline_s
            elif self._held_by_other():
                return await self._lose("another replica holds the lease")

    async def _attempt(self, within_s: float) -> tuple[asyncio.Task[bool], bool]:
        """One `_try` given `within_s` seconds: (the attempt, whether it was answered in time).

        Not `asyncio.wait_for` (on Python 3.11 it returns the result, swallowing a cancellation
        of this task that arrives as the attempt finishes): a shutdown must always stop the elector.
        """
        attempt = asyncio.ensure_future(self._try())
        try:
            done, _ = await asyncio.wait({attempt}, timeout=within_s)
        except asyncio.CancelledError:
            attempt.cancel()
            raise
        return attempt, bool(done)

    async def _lose(self, why: str) -> None:
        self.is_leader = False
        log.warning(
            "lost leadership of lease %s/%s (%s); stopping reconciles", self.config.namespace, self.config.name, why
        )
        await self._on_stopped()

    def _held_by_other(self) -> bool:
        return self._observed is not None and self._observed[0] not in (None, "", self.config.identity)

    async def _try(self) -> bool:
        """One acquire-or-renew attempt; True when we hold the lease afterwards."""
        cfg = self.config
        try:
            lease = await self._api.read_namespaced_lease(
                cfg.name, cfg.namespace, _request_timeout=cfg.renew_deadline_s
            )
        except ApiException as exc:
            if exc.status != 404:
                log.warning("cannot read lease %s/%s: HTTP %s", cfg.namespace, cfg.name, exc.status)
                return False
            return await self._create()
        except Exception as exc:  # connection trouble: keep trying until the deadline
            log.warning("cannot read lease %s/%s: %s", cfg.namespace, cfg.name, type(exc).__name__)
            return False
        spec = lease.spec
        record = (spec.holder_identity, spec.renew_time, spec.lease_transitions)
        if record != self._observed:
            self._observed, self._observed_at = record, time.monotonic()
        holder = spec.holder_identity
        duration = spec.lease_duration_seconds or cfg.lease_s
        expired = time.monotonic() > self._observed_at + duration
        if holder and holder != cfg.identity and not expired:
            return False
        now = _now()
        spec.holder_identity = cfg.identity
        spec.lease_duration_seconds = int(cfg.lease_s)
        spec.renew_time = now
        if holder != cfg.identity:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        try:
            await self._api.replace_namespaced_lease(
                cfg.name, cfg.namespace, lease, _request_timeout=cfg.renew_deadline_s
            )
        except ApiException as exc:
            if exc.status != 409:  # 409: someone else wrote first
                log.warning("cannot update lease %s/%s: HTTP %s", cfg.namespace, cfg.name, exc.status)
            return False
        except Exception as exc:
            log.warning("cannot update lease %s/%s: %s", cfg.namespace, cfg.name, type(exc).__name__)
            return False
        return True

    async def _create(self) -> bool:
        cfg = self.config
        now = _now()
        body = {
            "metadata": {"name": cfg.name, "namespace": cfg.namespace},
            "spec": {
                "holderIdentity": cfg.identity,
                "leaseDurationSeconds": int(cfg.lease_s),
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        try:
            await self._api.create_namespaced_lease(cfg.namespace, body, _request_timeout=cfg.renew_deadline_s)
        except ApiException as exc:
            if exc.status != 409:
                log.warning("cannot create lease %s/%s: HTTP %s", cfg.namespace, cfg.name, exc.status)
            return False
        except Exception as exc:
            log.warning("cannot create lease %s/%s: %s", cfg.namespace, cfg.name, type(exc).__name__)
            return False
        return True

    async def _release(self) -> None:
        """Hand the lease over at once on a clean shutdown instead of making others wait 15 s."""
        cfg = self.config
        lease = await self._api.read_namespaced_lease(cfg.name, cfg.namespace, _request_timeout=cfg.retry_s)
        if lease.spec.holder_identity != cfg.identity:
            return
        lease.spec.holder_identity = ""
        lease.spec.lease_duration_seconds = 1
        lease.spec.renew_time = _now()
        await self._api.replace_namespaced_lease(cfg.name, cfg.namespace, lease, _request_timeout=cfg.retry_s)


async def _drop(attempt: asyncio.Task[bool]) -> None:
    """Cancel an unanswered attempt and wait until it has stopped.

    Waited for with `asyncio.wait`, not `await attempt`: awaiting it would raise the same
    CancelledError for its cancellation and for one of the caller's, and suppressing that
    would swallow a shutdown (the elector then retried forever, found by tests/unit/test_leader.py).
    """
    attempt.cancel()
    await asyncio.wait({attempt})
