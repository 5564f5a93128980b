"""The operator's long-lived parts: API client, HTTP session, queue, workers,
leader election, and the health/metrics and events servers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from servegraph import __version__
from servegraph.kube import Kube, KubeError, connect
from servegraph.kube.client import secret_value
from servegraph.operator.events_endpoint import events_app
from servegraph.operator.leader import LeaderElector, LeaseConfig
from servegraph.operator.metrics import Metrics
from servegraph.operator.queue import WorkQueue
from servegraph.operator.reconcile import Key, Reconciler, run_worker
from servegraph.source.guard import HostGuard, guarded_connector

log = logging.getLogger("servegraph.operator")


@dataclass(frozen=True)
class Options:
    kubeconfig: str | None = None
    workers: int = 4
    health_host: str = "0.0.0.0"  # noqa: S104 - probes and scrapes come from the kubelet and Prometheus
    health_port: int = 8080
    leader_elect: bool = False
    lease_namespace: str = "servegraph-system"
    lease_name: str = "servegraph-operator"
    identity: str = field(default_factory=lambda: os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}")
    events_host: str | None = None
    events_port: int = 8081
    events_token_secret: tuple[str, str] | None = None
    allowed_source_hosts: Sequence[str] = ("*",)


@dataclass
class Operator:
    options: Options
    reconciler: Reconciler
    queue: WorkQueue[Key]
    session: aiohttp.ClientSession
    kube: Kube
    metrics: Metrics
    runners: list[web.AppRunner] = field(default_factory=list)
    workers: list[asyncio.Task[None]] = field(default_factory=list)
    elector_task: asyncio.Task[None] | None = None
    events_token: str | None = None
    ports: dict[str, int] = field(default_factory=dict)

    async def start_workers(self) -> None:
        """Reconcile from now on; every known ServeGraph is queued, for what was missed."""
        if not self.workers:
            self.workers = [
                asyncio.create_task(run_worker(self.reconciler, self.queue)) for _ in range(self.options.workers)
            ]
            self.reconciler.resync_all()

    async def stop_workers(self) -> None:
        """Stop reconciling at once, in-flight reconciles included."""
        workers, self.workers = self.workers, []
        for task in workers:
            task.cancel()
        for task in workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def secret_changed(self, namespace: str, name: str, data: Mapping[str, str] | None, deleted: bool) -> None:
        self.reconciler.secret_changed(namespace, name, data, deleted)
        if self.options.events_token_secret == (namespace, name):
            asyncio.get_running_loop().create_task(self.load_events_token())

    async def load_events_token(self) -> None:
        if self.options.events_token_secret is None:
            return
        ns, name = self.options.events_token_secret
        try:
            token = secret_value(ns, name, "token", await self.kube.read_secret_data(ns, name))
        except KubeError as exc:
            log.warning("events endpoint token unavailable (%s); the endpoint answers 401", exc.reason)
            self.events_token = None
            return
        self.events_token = token.strip() or None

    async def stop(self) -> None:
        if self.elector_task is not None:
            self.elector_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.elector_task
        await self.stop_workers()
        for runner in self.runners:
            await runner.cleanup()
        await self.session.close()
        await self.kube.api.close()


def health_app(metrics: Metrics) -> web.Application:
    """/healthz and /readyz for the kubelet, /metrics for Prometheus."""

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def scrape(_: web.Request) -> web.Response:
        return web.Response(body=metrics.exposition(), content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/healthz", ok)
    app.router.add_get("/readyz", ok)
    app.router.add_get("/metrics", scrape)
    return app


async def _serve(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


async def start(options: Options) -> Operator:
    api = await connect(options.kubeconfig)
    # Audit logs then tell replicas apart, as they share one ServiceAccount.
    api.user_agent = f"servegraph-operator/{__version__} ({options.identity})"
    kube = Kube(api)
    metrics = Metrics()
    queue: WorkQueue[Key] = WorkQueue()
    session = aiohttp.ClientSession(connector=guarded_connector())
    reconciler = Reconciler(kube, session, metrics, queue, guard=HostGuard(options.allowed_source_hosts))
    operator = Operator(options, reconciler, queue, session, kube, metrics)
    runner, operator.ports["health"] = await _serve(health_app(metrics), options.health_host, options.health_port)
    operator.runners.append(runner)
    if options.events_host is not None:
        await operator.load_events_token()
        app = events_app(
            lambda: operator.events_token, lambda: list(reconciler.bodies.values()), kube.annotate_servegraph
        )
        runner, operator.ports["events"] = await _serve(app, options.events_host, options.events_port)
        operator.runners.append(runner)
    if options.leader_elect:
        lease = LeaseConfig(options.lease_namespace, options.lease_name, options.identity)
        elector = LeaderElector(api, lease, operator.start_workers, operator.stop_workers)
        operator.elector_task = asyncio.create_task(elector.run())
    else:
        await operator.start_workers()
    return operator
