"""The operator's long-lived parts: API client, HTTP session, queue, workers, health server."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from servegraph.kube import Kube, connect
from servegraph.operator.metrics import Metrics
from servegraph.operator.queue import WorkQueue
from servegraph.operator.reconcile import Key, Reconciler, run_worker


@dataclass(frozen=True)
class Options:
    kubeconfig: str | None = None
    workers: int = 4
    health_host: str = "0.0.0.0"  # noqa: S104 - probes and scrapes come from the kubelet and Prometheus
    health_port: int = 8080


@dataclass
class Operator:
    reconciler: Reconciler
    queue: WorkQueue[Key]
    session: aiohttp.ClientSession
    kube: Kube
    metrics: Metrics
    runner: web.AppRunner
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    port: int = 0

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.runner.cleanup()
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


async def start(options: Options) -> Operator:
    api = await connect(options.kubeconfig)
    kube = Kube(api)
    metrics = Metrics()
    queue: WorkQueue[Key] = WorkQueue()
    session = aiohttp.ClientSession()
    reconciler = Reconciler(kube, session, metrics, queue)
    runner = web.AppRunner(health_app(metrics), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, options.health_host, options.health_port)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    operator = Operator(reconciler, queue, session, kube, metrics, runner, port=port)
    operator.tasks = [asyncio.create_task(run_worker(reconciler, queue)) for _ in range(options.workers)]
    return operator
