"""What the chaos tests (test_chaos.py) share: a production-shaped fleet of tenants, operator
replicas with leader election and the events endpoint, a "graph published" sender that
retries as a real one does, and the two checks every case ends with: everything converged,
and no RayService written twice.

Each tenant has a ServeGraph of its own in one of several namespaces, reading a graph of its
own from bench/tenant_graphs.py (5 to 200 nodes, some on GPUs, some autoscaled): a fault that
mixed up two tenants' graphs, or applied an old version, shows as a wrong serveConfigV2.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import importlib.util
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import ModuleType
from typing import Any

import aiohttp
from cloudevents.core.bindings.http import to_binary_event
from cloudevents.core.v1.event import CloudEvent
from kubernetes_asyncio import client
from sg_support import GROUP, OPERATOR_USER, PLURAL, VERSION, start_operator
from support import ROOT

from servegraph.graph import parse_graph
from servegraph.names import REFRESH_ANNOTATION
from servegraph.render import serve_config_yaml
from servegraph_testbed import WRITE_VERBS, Component, ControlPlane
from servegraph_testbed.registry import RegistryServer

SEED = 44
SYSTEM_NS = "servegraph-system"
LEASE = "servegraph-operator-chaos"
EVENTS_SECRET = "chaos-events"
EVENTS_TOKEN = "chaos-events-t0ken"


@functools.cache
def _tenant_graphs() -> ModuleType:
    """bench/tenant_graphs.py (bench/ is scripts, not a package), as tests/unit/bench_modules.py loads it."""
    if "tenant_graphs" in sys.modules:
        return sys.modules["tenant_graphs"]
    spec = importlib.util.spec_from_file_location("tenant_graphs", ROOT / "bench" / "tenant_graphs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tenant_graphs"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@functools.cache
def graph_bytes(index: int, version: int) -> bytes:
    data: bytes = _tenant_graphs().graph_bytes(SEED, index, version)
    return data


@functools.cache
def serve_config(index: int, version: int) -> str:
    """The serveConfigV2 the operator renders for a tenant's graph at that version."""
    return serve_config_yaml(parse_graph(graph_bytes(index, version)))


@dataclass
class Tenant:
    namespace: str
    name: str
    index: int
    polling: bool = False
    version: int = 1
    """The graph version the registry serves, which the RayService must end on."""
    image: str | None = None
    """The image its spec asks for (None: never set, the operator's default)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def graph(self) -> str:
        return f"chaos-{self.index:04d}"


def _head_image(rs: dict[str, Any]) -> str:
    return str(rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"])


def _conditions(sg: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (sg.get("status") or {}).get("conditions") or []}


@dataclass
class Fleet:
    """`count` tenants over `namespaces` namespaces, round-robin; in each namespace every
    `poll_every`-th one polls its registry."""

    api: Any
    registry: RegistryServer
    ca_pem: str
    tenants: list[Tenant] = field(default_factory=list)

    @property
    def custom(self) -> Any:
        return client.CustomObjectsApi(self.api)

    @property
    def namespaces(self) -> list[str]:
        return sorted({t.namespace for t in self.tenants})

    def pick(self, count: int, *, skip: set[str] = frozenset(), polling: bool = False) -> list[Tenant]:
        """`count` tenants spread over every namespace (round-robin), none of `skip`."""
        pool = [t for t in self.tenants if t.polling == polling and t.key not in skip]
        by_ns: dict[str, list[Tenant]] = {}
        for t in pool:
            by_ns.setdefault(t.namespace, []).append(t)
        picked: list[Tenant] = []
        while len(picked) < count and any(by_ns.values()):
            for ns in sorted(by_ns):
                if by_ns[ns] and len(picked) < count:
                    picked.append(by_ns[ns].pop(0))
        assert len(picked) == count, f"the fleet has only {len(picked)} tenants to pick"
        return picked

    async def create(self, count: int, namespaces: int, poll_every: int, prefix: str = "chaos") -> None:
        core = client.CoreV1Api(self.api)
        for n in range(namespaces):
            ns = f"{prefix}-{n:02d}"
            await core.create_namespace({"metadata": {"name": ns}})
            for name, key, value in (("token", "token", self.registry.registry.token), ("ca", "ca.crt", self.ca_pem)):
                data = {key: base64.b64encode(value.encode()).decode()}
                await core.create_namespaced_secret(ns, {"metadata": {"name": name}, "data": data})
        self.tenants = [
            Tenant(f"{prefix}-{i % namespaces:02d}", f"t{i:04d}", i, polling=(i // namespaces) % poll_every == 0)
            for i in range(count)
        ]
        gate = asyncio.Semaphore(16)

        async def one(t: Tenant) -> None:
            self.registry.registry.publish(t.graph, graph_bytes(t.index, t.version))
            source: dict[str, Any] = {
                "url": self.registry.url(t.graph),
                "tokenSecretRef": {"name": "token"},
                "caBundle": {"secretRef": {"name": "ca"}},
            }
            if t.polling:
                source.update(pollInterval="10s", timeout="5s")
            body = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "ServeGraph",
                "metadata": {"name": t.name},
                "spec": {"source": source},
            }
            async with gate:
                await self.custom.create_namespaced_custom_object(GROUP, VERSION, t.namespace, PLURAL, body)

        await asyncio.gather(*(one(t) for t in self.tenants))

    def publish(self, tenant: Tenant) -> None:
        """The tenant's next version, at the registry only (nobody is told)."""
        tenant.version += 1
        self.registry.registry.publish(tenant.graph, graph_bytes(tenant.index, tenant.version))

    async def refresh(self, tenant: Tenant, value: str) -> None:
        await self.patch_sg(tenant, {"metadata": {"annotations": {REFRESH_ANNOTATION: value}}})

    async def set_image(self, tenant: Tenant, image: str) -> None:
        tenant.image = image
        await self.patch_sg(tenant, {"spec": {"rayService": {"image": image}}})

    async def patch_sg(self, tenant: Tenant, patch: dict[str, Any]) -> None:
        await self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, tenant.namespace, PLURAL, tenant.name, patch, _content_type="application/merge-patch+json"
        )

    async def edit_rayservice(self, tenant: Tenant) -> None:
        """Someone else edits the RayService's spec (drift the operator must repair)."""
        patch = {"spec": {"serveConfigV2": "applications: []\n"}}
        await self.custom.patch_namespaced_custom_object(
            "ray.io", "v1", tenant.namespace, "rayservices", tenant.name, patch,
            _content_type="application/merge-patch+json",
        )  # fmt: skip

    async def delete_rayservice(self, tenant: Tenant) -> None:
        await self.custom.delete_namespaced_custom_object("ray.io", "v1", tenant.namespace, "rayservices", tenant.name)

    async def generations(self) -> dict[str, tuple[str, int]]:
        """Each RayService ("ns/name"): its uid and generation (a spec change moves it)."""
        found = {}
        for ns in self.namespaces:
            listed = await self.custom.list_namespaced_custom_object("ray.io", "v1", ns, "rayservices")
            for rs in listed["items"]:
                meta = rs["metadata"]
                found[f"{ns}/{meta['name']}"] = (meta["uid"], int(meta["generation"]))
        return found

    async def behind(self) -> list[str]:
        """Each tenant not (yet) as it should be, and why: its RayService missing, on another
        graph version or image, or its status not saying Applied on the right version."""
        wrong: list[str] = []
        for ns in self.namespaces:
            listed = await self.custom.list_namespaced_custom_object("ray.io", "v1", ns, "rayservices")
            rayservices = {rs["metadata"]["name"]: rs for rs in listed["items"]}
            listed = await self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
            servegraphs = {sg["metadata"]["name"]: sg for sg in listed["items"]}
            for t in (t for t in self.tenants if t.namespace == ns):
                rs, sg = rayservices.get(t.name), servegraphs[t.name]
                status = sg.get("status") or {}
                if rs is None:
                    wrong.append(f"{t.key}: no RayService (status says {_conditions(sg)})")
                elif rs["spec"].get("serveConfigV2") != serve_config(t.index, t.version):
                    wrong.append(f"{t.key}: RayService not on graph version {t.version}")
                elif t.image is not None and _head_image(rs) != t.image:
                    wrong.append(f"{t.key}: RayService image {_head_image(rs)}, not {t.image}")
                elif (status.get("graph") or {}).get("version") != str(t.version):
                    wrong.append(f"{t.key}: status names graph {status.get('graph')}, not version {t.version}")
                elif _conditions(sg).get("Applied") != "True" or _conditions(sg).get("Fetched") != "True":
                    wrong.append(f"{t.key}: conditions {_conditions(sg)}")
                elif status.get("observedGeneration") != sg["metadata"]["generation"]:
                    wrong.append(f"{t.key}: observedGeneration {status.get('observedGeneration')} is behind")
        return wrong

    async def wait_converged(self, within: float, since: float | None = None) -> float:
        """Seconds from `since` (monotonic; default now) until every tenant is as it should be."""
        start = time.monotonic() if since is None else since
        deadline = time.monotonic() + within
        while True:
            try:
                wrong = await self.behind()
            except client.ApiException as exc:  # the API server may just be coming back
                wrong = [f"listing failed: HTTP {exc.status}"]
            if not wrong:
                return time.monotonic() - start
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{len(wrong)} of {len(self.tenants)} tenants not converged within {within:g} s: {wrong[:10]}"
                )
            await asyncio.sleep(0.25)


def rayservice_writes(cp: ControlPlane, since: int) -> Counter[str]:
    """Each RayService ("ns/name") the operator wrote since the mark, and how many times,
    counting only the writes the API server completed (the audit log's own account)."""
    events = cp.audit_log.events(user=OPERATOR_USER, verbs=WRITE_VERBS, resource="rayservices", since=since)
    return Counter(
        f"{e['objectRef']['namespace']}/{e['objectRef']['name']}"
        for e in events
        if (e.get("responseStatus") or {}).get("code", 0) < 300
    )


@dataclass(frozen=True)
class Mark:
    """Where a case starts: the audit log's offset, and each RayService's uid and generation."""

    audit: int
    generations: dict[str, tuple[str, int]]


async def mark(cp: ControlPlane, fleet: Fleet) -> Mark:
    return Mark(cp.audit_log.offset(), await fleet.generations())


async def assert_written_once(
    cp: ControlPlane,
    fleet: Fleet,
    start: Mark,
    changed: list[Tenant],
    *,
    edited: Sequence[Tenant] = (),
    deleted: Sequence[Tenant] = (),
) -> None:
    """Every changed tenant's RayService written exactly once, no other written at all.

    First as KubeRay sees it, by each RayService's generation (its spec changed): once for a
    change, twice for one someone else edited (the edit, then the repair), a new object for
    one deleted (created again); no other changed. Then as the API server counted the
    requests (the audit log): a write that changed nothing is a write all the same, and none
    may go to another RayService. (A write the audit log lacks is no error: an API server
    SIGKILLed after storing a write and before logging it never logs it; its generation
    shows it landed.)"""
    now = await fleet.generations()
    moved, repaired, recreated = ({t.key for t in group} for group in (changed, edited, deleted))
    wrong = {}
    for t in fleet.tenants:
        (uid, gen), (uid_now, gen_now) = start.generations[t.key], now.get(t.key, ("gone", 0))
        if t.key in recreated:
            ok = uid_now not in (uid, "gone") and gen_now == 1
        else:
            step = 2 if t.key in repaired else 1 if t.key in moved else 0
            ok = uid_now == uid and gen_now == gen + step
        if not ok:
            wrong[t.key] = f"generation {gen} -> {gen_now}" + ("" if uid_now == uid else " (another object)")
    assert not wrong, f"RayService specs not changed exactly once: {dict(list(wrong.items())[:10])}"
    writes = rayservice_writes(cp, start.audit)
    twice = {k: n for k, n in writes.items() if n > 1}
    assert not twice, (
        f"RayServices written more than once (each spec changed once: the extra writes changed nothing): {twice}"
    )
    unasked = sorted(set(writes) - (moved | repaired | recreated))
    assert not unasked, f"RayServices written though nothing of theirs changed: {unasked[:10]}"


@dataclass
class Replica:
    """One operator process (`servegraph run --leader-elect` with the events endpoint), bound
    by config/rbac only; started again under the same name after a kill."""

    cp: ControlPlane
    name: str
    events_port: int
    component: Component | None = None
    starts: int = 0
    log_from: int = 0
    """Where this process's lines begin in the log (shared by every start of the replica)."""

    def start(self) -> None:
        """Blocking (waits for /readyz): from a test, `await asyncio.to_thread(replica.start)`."""
        log = self.cp.component_log(self.name)
        self.log_from = len(log.read_text(errors="replace")) if log.exists() else 0
        self.component, _ = start_operator(
            self.cp,
            self.name,
            "--leader-elect",
            f"--leader-election-namespace={SYSTEM_NS}",
            f"--leader-election-id={LEASE}",
            f"--events-address=127.0.0.1:{self.events_port}",
            f"--events-token-secret={SYSTEM_NS}/{EVENTS_SECRET}",
            env={"POD_NAME": f"{self.name}-{self.starts}"},
        )
        self.starts += 1

    @property
    def running(self) -> bool:
        return self.component is not None and self.component.running

    @property
    def identity(self) -> str:
        """How its Lease holder identity and user agent begin: `<POD_NAME>_`."""
        return f"{self.name}-{self.starts - 1}_"

    def kill(self) -> None:
        assert self.component is not None
        self.component.kill()
        self.cp.unspawn(self.component)
        self.component = None

    def stop(self) -> None:
        if self.component is not None:
            self.cp.unspawn(self.component)
            self.component = None

    def log(self) -> str:
        return self.cp.component_log(self.name).read_text(errors="replace")

    @property
    def has_led(self) -> bool:
        """Whether this process has led: it remembers what it reconciled then."""
        return "became leader" in self.log()[self.log_from :]


def full_identity(cp: ControlPlane, replica: Replica) -> str:
    """A replica's Lease identity, `<POD_NAME>_<suffix>` (the suffix is the process's own), read
    from the user agent of its requests in the audit log."""
    for event in reversed(cp.audit_log.events(user=OPERATOR_USER)):
        agent = event.get("userAgent", "")
        at = agent.find(f"({replica.identity}")
        if at >= 0:
            return agent[at + 1 :].split(")")[0].split(";")[0]
    raise AssertionError(f"{replica.name} has made no request yet")


async def hand_lease_to(api: Any, identity: str) -> None:
    """Write the Lease as held by `identity`, renewed now: its holder stops leading at its next
    renewal, as after a pause or an outage a standby took over; `identity` leads at its next try."""
    coordination = client.CoordinationV1Api(api)
    lease = await coordination.read_namespaced_lease(LEASE, SYSTEM_NS)
    lease.spec.holder_identity = identity
    lease.spec.renew_time = datetime.now(UTC)
    lease.spec.lease_transitions = (lease.spec.lease_transitions or 0) + 1
    await coordination.replace_namespaced_lease(LEASE, SYSTEM_NS, lease)


async def lease_holder(api: Any) -> str | None:
    try:
        lease = await client.CoordinationV1Api(api).read_namespaced_lease(LEASE, SYSTEM_NS)
    except client.ApiException:
        return None
    return lease.spec.holder_identity or None


@dataclass
class Sender:
    """A registry's webhook: posts "graph published" to the replicas' Service (here: each
    running replica in turn) and sends again on 5xx, 429 or no answer, after Retry-After;
    anything else it was answered is final (a 4xx would drop the event for good)."""

    ports: Callable[[], list[int]]
    answers: list[tuple[float, str, int | None]] = field(default_factory=list)
    """(monotonic time, event id, HTTP status or None for no answer), every attempt."""

    async def send(self, url: str, event_id: str, within: float = 150) -> dict[str, Any]:
        event = CloudEvent(
            attributes={"type": "io.servegraph.graph.published", "source": "https://r", "id": event_id, "subject": url}
        )
        message = to_binary_event(event)
        headers = {**message.headers, "Authorization": f"Bearer {EVENTS_TOKEN}"}
        deadline = time.monotonic() + within
        attempt = 0
        while True:
            ports = self.ports()
            port = ports[attempt % len(ports)] if ports else 0
            attempt += 1
            status: int | None = None
            wait = 1.0
            try:
                async with (
                    aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
                    session.post(f"http://127.0.0.1:{port}/v1/events", headers=headers, data=message.body) as r,
                ):
                    status, body = r.status, await r.json()
                    wait = float(r.headers.get("Retry-After", "1"))
            except (aiohttp.ClientError, OSError, TimeoutError):
                pass
            self.answers.append((time.monotonic(), event_id, status))
            if status == 202:
                answer: dict[str, Any] = body
                return answer
            if status is not None and status < 500 and status != 429:
                raise AssertionError(f"event {event_id} answered {status} {body}: a sender drops it for good")
            if time.monotonic() + wait > deadline:
                raise AssertionError(f"event {event_id} not taken within {within:g} s; last answer {status}")
            await asyncio.sleep(wait)
