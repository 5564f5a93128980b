"""What the fault tests share: an operator process that can be SIGKILLed and started
again, and the proof that a failure left the last good RayService alone."""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sg_support import OPERATOR_USER, Kit, start_operator

from servegraph.names import SPEC_HASH_ANNOTATION
from servegraph_testbed import WRITE_VERBS, Component, ControlPlane
from servegraph_testbed.waiting import eventually

T = TypeVar("T")


@dataclass
class OperatorProcess:
    """`servegraph run` as one process at a time: started, killed, started again.

    The log file is the same across restarts, so one check at the end covers them all.
    """

    cp: ControlPlane
    name: str = "servegraph-operator-faults"
    component: Component | None = None
    starts: int = 0

    def start(self) -> Component:
        """Blocking (waits for /readyz): from a test, `await asyncio.to_thread(op.start)`."""
        # Downloads at once per namespace: more than the default 2, as the SIGKILL test needs
        # downloads in flight in one namespace while others of it are applied.
        self.component, _ = start_operator(
            self.cp, self.name, "--fetches-per-namespace=8", env={"POD_NAME": f"{self.name}-{self.starts}"}
        )
        self.starts += 1
        return self.component

    def ensure_running(self) -> Component:
        if self.component is not None and self.component.running:
            return self.component
        self.stop()
        return self.start()

    @property
    def pid(self) -> int:
        assert self.component is not None and self.component.pid is not None, "the operator is not running"
        return self.component.pid

    @property
    def identity(self) -> str:
        """What the audit log's userAgent names this process by: `(<POD_NAME>_<suffix>)` (app.Options)."""
        return f"({self.name}-{self.starts - 1}_"

    def kill(self) -> None:
        """SIGKILL, no grace: no cleanup handler, no in-flight request finishes."""
        os.killpg(self.pid, signal.SIGKILL)
        self.stop()  # only reaps: the group is gone

    def stop(self) -> None:
        if self.component is not None:
            self.cp.unspawn(self.component)
            self.component = None


@dataclass(frozen=True)
class LastGood:
    """The RayService and the ServeGraph status as they were before a fault."""

    rs: dict[str, Any]
    sg_status: dict[str, Any]
    audit_mark: int

    @property
    def rs_name(self) -> str:
        return str(self.rs["metadata"]["name"])


async def snapshot(kit: Kit, cp: ControlPlane, sg: str) -> LastGood:
    status = (await kit.get_sg(sg))["status"]
    rs = await kit.get_rs(status["rayServiceName"])
    assert rs is not None
    return LastGood(rs, status, cp.audit_log.offset())


async def assert_untouched(kit: Kit, cp: ControlPlane, sg: str, before: LastGood) -> None:
    """The operator wrote nothing to the RayService since the snapshot, and the status
    still names the last good graph.

    The resourceVersion is compared unless KubeRay (if another test module started it)
    wrote the RayService's status meanwhile; its spec and generation are compared always.
    """
    name = before.rs_name
    now = await kit.get_rs(name)
    assert now is not None, f"RayService {name} is gone"
    writes = [
        e
        for e in cp.audit_log.events(
            verbs=WRITE_VERBS, resource="rayservices", namespace=kit.namespace, since=before.audit_mark
        )
        if (e.get("objectRef") or {}).get("name") == name
    ]
    ours = [(e["verb"], e.get("requestURI")) for e in writes if e["user"]["username"] == OPERATOR_USER]
    assert ours == [], f"the operator wrote RayService {name}: {ours}"
    meta, old = now["metadata"], before.rs["metadata"]
    assert (meta["uid"], meta["generation"]) == (old["uid"], old["generation"])
    assert meta["annotations"][SPEC_HASH_ANNOTATION] == old["annotations"][SPEC_HASH_ANNOTATION]
    assert now["spec"]["serveConfigV2"] == before.rs["spec"]["serveConfigV2"]
    assert now["spec"] == before.rs["spec"]
    if not writes:
        assert meta["resourceVersion"] == old["resourceVersion"]
    status = (await kit.get_sg(sg))["status"]
    assert status["graph"] == before.sg_status["graph"], "status must keep naming the last good graph"
    assert status["rayServiceName"] == name


async def retrying(call: Callable[[], Awaitable[T]], what: str, within: float = 60) -> T:
    """Run an API call until it succeeds once (the API server may just have restarted)."""

    async def attempt() -> tuple[T]:
        return (await call(),)

    return (await eventually(attempt, within=within, what=what))[0]


def request_count(kit: Kit, graph: str) -> int:
    return len(kit.requests_for(graph))
