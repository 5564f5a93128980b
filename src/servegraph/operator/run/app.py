"""The operator as a running program: API client, registry client, graph parser, queue,
workers, leader election, and the health/metrics and events servers, wired together.

`start` is the one place the I/O is chosen (the real Kubernetes client, the
registry client under the administrator's source policy, the sandboxed parser);
the reconciler itself only sees their interfaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass, field

from aiohttp import web

from servegraph import __version__
from servegraph.evidence import Reader
from servegraph.evidence.prometheus import PrometheusEvidence
from servegraph.evidence.routers import RoutersEvidence
from servegraph.kube import KubeClient, KubeError, connect
from servegraph.kube.crds import get_crd
from servegraph.kube.reviews import Reviews
from servegraph.kube.routes import RouteClient
from servegraph.names import FIELD_MANAGER, LEASE_NAME, OPERATOR_NAMESPACE, Key
from servegraph.operator import secrets
from servegraph.operator.fetch.parsing import GraphParser, default_workers
from servegraph.operator.gateways import GatewayPolicy
from servegraph.operator.metrics import Metrics
from servegraph.operator.queue import WorkQueue
from servegraph.operator.reconcile import Reconciler
from servegraph.operator.run.echoes import EchoFilter
from servegraph.operator.run.events_endpoint import Unavailable, events_app
from servegraph.operator.run.leader import LeaderElector, LeaseConfig
from servegraph.operator.run.metrics_auth import MetricsGuard
from servegraph.operator.run.sharding import Shard
from servegraph.operator.run.worker import run_worker
from servegraph.operator.secrets import SecretError, SecretKeyRef
from servegraph.render.kuberay_features import RAYSERVICE_CRD, KubeRayFeatures, NotARayServiceCRD
from servegraph.source import Limits, RegistryClient, SourcePolicy

log = logging.getLogger("servegraph.operator")

TOKEN_TTL_S = 10.0
"""How long the events endpoint trusts its copy of the token Secret (rotation latency)."""
TOKEN_RETRY_S = 1.0
"""A mismatch, or a failed read, reads the Secret again at most this often."""
EVENTS_API_TIMEOUT_S = 5.0
"""The events endpoint's API calls: a sender waits for the answer, and a 503 it can retry
beats one that comes after its own timeout."""


@dataclass(frozen=True)
class Options:
    kubeconfig: str | None = None
    context: str | None = None
    """The kubeconfig's context (None: its current one)."""
    workers: int = 4
    health_host: str = "0.0.0.0"  # noqa: S104 - probes and scrapes come from the kubelet and Prometheus
    health_port: int = 8080
    leader_elect: bool = False
    lease_namespace: str = OPERATOR_NAMESPACE
    lease_name: str = LEASE_NAME
    # Unique per process (as client-go's `hostname_uuid`): a container restarted in the same
    # pod must not resume a Lease its dead predecessor held, but wait for it like any standby.
    identity: str = field(
        default_factory=lambda: f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    )
    events_host: str | None = None
    events_port: int = 8081
    events_token_secret: SecretKeyRef | None = None
    policy: SourcePolicy = field(default_factory=SourcePolicy)
    limits: Limits = field(default_factory=Limits)
    fetches_per_namespace: int = 2
    max_downloads: int = 64
    serve_service_types: frozenset[str] = frozenset()
    serve_service_annotations: tuple[str, ...] = ()
    """Annotation key prefixes a serveService may use (operator/serve_service.py); none by default."""
    gateways: GatewayPolicy = field(default_factory=GatewayPolicy)
    """The Gateways spec.expose and gateway classes clusterUpgradeOptions may name (operator/gateways.py)."""
    parse_workers: int = 0
    """Graph parse processes; 0: `parsing.default_workers()`, from the CPU limit."""
    shard: Shard = field(default_factory=Shard)
    """Which ServeGraphs this instance owns (operator/run/sharding.py); default: all."""
    metrics_auth: bool = False
    """/metrics only for bearer tokens the API server authorizes (operator/run/metrics_auth.py)."""
    namespaces: tuple[str, ...] | None = None
    """The namespaces watched (kopf's, globs allowed); None: the whole cluster."""
    prometheus_url: str | None = None
    """Where a canary's evidence is read (Prometheus' HTTP API); None: the routers' own counters,
    through each RayService's serve Service."""


@dataclass
class EventsToken:
    """The events endpoint's token, read on demand and kept `TOKEN_TTL_S`: the operator
    watches no Secret, and may `get` this one even where it watches no namespace.

    When it cannot be read (the API server down, the Secret missing or unreadable) `get`
    raises Unavailable and the endpoint answers 503, never 401: the sender's token may well
    be right, and the event must be sent again, not dropped. A copy older than its TTL is
    not used meanwhile: the token may have been rotated because it leaked. Concurrent
    requests share one read."""

    kube: KubeClient
    ref: SecretKeyRef
    value: str | None = field(default=None, repr=False)
    read_at: float = -1e9
    warned: bool = False
    _reading: asyncio.Task[None] | None = field(default=None, repr=False)

    async def get(self, mismatch: bool = False) -> str:
        age = time.monotonic() - self.read_at
        stale = age >= TOKEN_TTL_S or ((mismatch or self.value is None) and age >= TOKEN_RETRY_S)
        if stale:
            await self.load()
        if self.value is None:
            raise Unavailable(f"the events token Secret {self.ref.namespace}/{self.ref.name} cannot be read")
        return self.value

    async def load(self) -> None:
        if self._reading is None or self._reading.done():
            self._reading = asyncio.create_task(self._read())
        await asyncio.shield(self._reading)  # a sender that hangs up does not cancel the others' read

    async def _read(self) -> None:
        try:
            token = secrets.value(self.ref, await self.kube.read_secret_data(self.ref.namespace, self.ref.name))
        except (KubeError, SecretError) as exc:
            self._unreadable(exc.reason)
            return
        finally:
            self.read_at = time.monotonic()
        if not token.strip():
            self._unreadable("EmptyValue")
            return
        if self.warned:
            log.info("events endpoint token readable again")
        self.value, self.warned = token.strip(), False

    def _unreadable(self, reason: str) -> None:
        if not self.warned:  # once per outage, not once per request
            log.warning("events endpoint token unavailable (%s); the endpoint answers 503 until it is read", reason)
        self.value, self.warned = None, True


@dataclass
class Operator:
    options: Options
    reconciler: Reconciler
    queue: WorkQueue[Key]
    registry: RegistryClient
    parser: GraphParser
    kube: KubeClient
    metrics: Metrics
    echoes: EchoFilter
    events_kube: KubeClient | None = None
    """The events endpoint's own API client: `stop_workers` resets the workers' connections on a
    Lease loss, and an event being annotated on one of them was answered as if refreshed."""
    runners: list[web.AppRunner] = field(default_factory=list)
    workers: list[asyncio.Task[None]] = field(default_factory=list)
    elector_task: asyncio.Task[None] | None = None
    ports: dict[str, int] = field(default_factory=dict)

    async def start_workers(self) -> None:
        """Reconcile from now on; every known ServeGraph is queued, for what was missed."""
        if not self.workers:
            self.workers = [
                asyncio.create_task(run_worker(self.reconciler, self.queue)) for _ in range(self.options.workers)
            ]
            self.reconciler.resync_all()

    async def stop_workers(self) -> None:
        """Stop acting at once: reset the API connections (what is in flight is dropped, not
        delivered late), then cancel every reconcile, in-flight ones included."""
        with contextlib.suppress(Exception):
            await self.kube.abort_connections()
        self.reconciler.downloads.cancel_all()  # nothing in flight is recorded: the next leader downloads again
        workers, self.workers = self.workers, []
        for task in workers:
            task.cancel()
        for task in workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def stop(self) -> None:
        if self.elector_task is not None:
            self.elector_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.elector_task
        await self.stop_workers()
        for runner in self.runners:
            await runner.cleanup()
        await self.registry.close()
        await self.parser.close()
        await self.kube.api.close()
        if self.events_kube is not None:
            await self.events_kube.api.close()


def health_app(metrics: Metrics, guard: MetricsGuard | None = None) -> web.Application:
    """/healthz and /readyz for the kubelet (open: they say nothing), /metrics for
    Prometheus (behind `guard` when there is one)."""

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def scrape(request: web.Request) -> web.Response:
        if guard is not None:
            status, reason = await guard.check(
                request.headers.get("Authorization"), request.path, request.remote or "unknown"
            )
            if status != 200:
                headers = {"WWW-Authenticate": 'Bearer realm="servegraph"'} if status == 401 else None
                if status in (429, 503):
                    headers = {"Retry-After": "2"}
                return web.Response(status=status, text=reason + "\n", headers=headers)
        return web.Response(body=metrics.exposition(), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/healthz", ok)
    app.router.add_get("/readyz", ok)
    app.router.add_get("/metrics", scrape)
    return app


async def _serve(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner, runner.addresses[0][1]  # the bound port, also when `port` was 0


async def cluster_policy(policy: SourcePolicy, kube: KubeClient) -> SourcePolicy:
    """The administrator's policy plus what the cluster itself says must not be a graph
    source: its API server as this client reaches it and its real endpoints (the
    `kubernetes` EndpointSlice, where the operator may read it: cluster-wide mode), its
    Service range (ServiceCIDRs, where the operator may list them: cluster-wide mode on
    Kubernetes 1.33+), and the operator's own pod (POD_IPS, from the downward API)."""
    endpoints = [(ipaddress.ip_address(a.split("%")[0]), p) for a, p in await kube.api_server_endpoints()]
    try:
        endpoints += [(ipaddress.ip_address(a), p) for a, p in await kube.api_server_slice_endpoints()]
    except (KubeError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        # NotFound: an API server without the endpoint reconciler publishes none to learn.
        log.log(
            logging.INFO if reason == "NotFound" else logging.WARNING,
            "cannot read the API server's endpoints, EndpointSlice default/kubernetes (%s); "
            "deny them with --denied-source-networks",
            reason,
        )
    networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    try:
        networks = [ipaddress.ip_network(c, strict=False) for c in await kube.service_cidrs()]
    except (KubeError, ValueError) as exc:
        log.warning(
            "cannot read the cluster's Service range (%s); deny it with --denied-source-networks",
            getattr(exc, "reason", exc),
        )
    return policy.with_denied(networks, endpoints, own_pod_addresses())


def own_pod_addresses() -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The operator's pod IPs, all ports of which are refused as sources: its health, metrics
    and events endpoints answer there. POD_IPS (status.podIPs, comma-separated) or POD_IP."""
    found = []
    for text in (os.environ.get("POD_IPS") or os.environ.get("POD_IP") or "").split(","):
        try:
            found.append(ipaddress.ip_address(text.strip()))
        except ValueError:
            if text.strip():
                log.warning("ignoring POD_IPS entry %r: not an IP address", text.strip())
    return found


async def kuberay_features(kube: KubeClient) -> KubeRayFeatures | None:
    """What the installed KubeRay's RayService CRD offers, read once; None when it cannot be read
    (the operator then uses none of what only some releases have: spec.suspend deletes)."""
    try:
        crd = await get_crd(kube, RAYSERVICE_CRD)
        if crd is None:
            raise KubeError("NotFound", f"{RAYSERVICE_CRD} is not installed")
        features = KubeRayFeatures.from_crd(crd)
    except (KubeError, NotARayServiceCRD) as exc:
        log.warning(
            "cannot read KubeRay's RayService CRD (%s): spec.suspend deletes the RayService "
            "(get on customresourcedefinitions/%s: cluster-wide mode)",
            getattr(exc, "reason", exc),
            RAYSERVICE_CRD,
        )
        return None
    log.info("KubeRay's RayService: %s", features.describe())
    return features


async def start(options: Options) -> Operator:
    api = await connect(options.kubeconfig, options.context)
    # Audit logs then tell replicas and shards apart, as they share one ServiceAccount.
    shard = options.shard
    where = "" if not shard.sharded else f"; shard {shard.name}" if shard.name else "; default shard"
    agent = f"{FIELD_MANAGER}/{__version__} ({options.identity}{where}"
    api.user_agent = agent + ")"
    kube = KubeClient(api)
    kube.shard = shard.name
    metrics = Metrics()
    queue: WorkQueue[Key] = WorkQueue()
    policy = await cluster_policy(options.policy, kube)
    log.info("graph sources: %s", policy.describe())
    registry = RegistryClient(policy, observe=metrics.observe_fetch)
    parser = GraphParser(workers=options.parse_workers or default_workers())
    await parser.start()
    evidence: Reader = PrometheusEvidence(options.prometheus_url) if options.prometheus_url else RoutersEvidence()
    reconciler = Reconciler(
        kube,
        registry.fetch,
        metrics,
        queue,
        parser=parser.parse,
        limits=options.limits,
        fetches_per_namespace=options.fetches_per_namespace,
        max_downloads=options.max_downloads,
        serve_service_types=options.serve_service_types,
        serve_service_annotations=options.serve_service_annotations,
        owns=shard.owns,
        kuberay=await kuberay_features(kube),
        routes=RouteClient(kube),
        gateways=options.gateways,
        evidence=evidence,
        watched=options.namespaces,
    )
    log.info("allowed for ServeGraphs: %s", options.gateways.describe())
    if shard.sharded:
        log.info("shard: ServeGraphs selected by %r, lease %s", shard.selector(), options.lease_name)
    echoes = EchoFilter(reconciler.cache)
    metrics.registry.register(echoes)
    operator = Operator(options, reconciler, queue, registry, parser, kube, metrics, echoes)
    if options.events_host is not None:
        if options.events_token_secret is None:
            raise ValueError("the events endpoint needs a token Secret (events_token_secret)")
        # Its own connections: standbys serve events too, and a Lease loss must not cut them.
        events_api = await connect(options.kubeconfig, options.context)
        events_api.user_agent = agent + "; events)"
        operator.events_kube = KubeClient(events_api, timeout_s=EVENTS_API_TIMEOUT_S)
        token = EventsToken(operator.events_kube, options.events_token_secret)
        await token.load()
        counted = metrics.events
        app = events_app(
            token.get,
            reconciler.cache.heads,
            operator.events_kube.annotate_servegraph,
            answered=lambda status: counted.labels(str(status)).inc(),
            synced=reconciler.servegraphs_synced,
        )
        runner, operator.ports["events"] = await _serve(app, options.events_host, options.events_port)
        operator.runners.append(runner)
    # Health last: /readyz answers only once every listener is up (a probe that passed
    # before the events port was bound sent the first "graph published" to a refusal).
    guard = MetricsGuard(Reviews(api).may_get) if options.metrics_auth else None
    health = health_app(metrics, guard)
    runner, operator.ports["health"] = await _serve(health, options.health_host, options.health_port)
    operator.runners.append(runner)
    if options.leader_elect:
        lease = LeaseConfig(options.lease_namespace, options.lease_name, options.identity)
        elector = LeaderElector(api, lease, operator.start_workers, operator.stop_workers)
        kube.may_write = elector.leading
        operator.elector_task = asyncio.create_task(elector.run())
    else:
        await operator.start_workers()
    return operator
