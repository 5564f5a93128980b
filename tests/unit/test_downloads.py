"""Downloads run beside the reconcile workers (operator/fetch/downloads.py).

Issue 45's first item and issue 44's fourth: downloads ran inside the four workers, so
registries that trickled or hung held every worker, and every other tenant's reconcile
(a status, a rollout, an image change needing no download) waited behind them. Issue 44's
first: a download cancelled half way (a lost Lease) had already marked its refresh done.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from memory_api import MemoryApiServer, MemoryRegistry
from reconcile_support import reconcile_through_downloads
from support import SAMPLES

from servegraph.names import REFRESH_ANNOTATION, Key
from servegraph.operator.cache import Memory
from servegraph.operator.fetch.download import Downloaded
from servegraph.operator.fetch.downloads import Downloads
from servegraph.operator.metrics import Metrics
from servegraph.operator.queue import WorkQueue
from servegraph.operator.reconcile import Reconciler
from servegraph.operator.run.worker import run_worker
from servegraph.operator.secrets import SecretKeyRef
from servegraph.operator.spec import Source
from servegraph.operator.values import Outcome
from servegraph.source import Fetched, FetchRequest
from servegraph.v1 import graph_pb2
from servegraph_testbed.waiting import eventually

TOKEN = "s3cret"
MINI = (SAMPLES / "mini.pb").read_bytes()
WORKERS = 4


def url(name: str) -> str:
    return f"https://registry.test/v1/graphs/{name}"


def servegraph(namespace: str, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "servegraph.io/v1alpha1",
        "kind": "ServeGraph",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}", "generation": 1},
        "spec": {"source": {"url": url(f"{namespace}-{name}"), "tokenSecretRef": {"name": "token"}}, **spec},
    }


def version(v: str) -> bytes:
    graph = graph_pb2.Graph.FromString(MINI)
    graph.version = v
    return graph.SerializeToString()


class Operator:
    """A reconciler, its queue and its workers on the in-memory API; registries the test controls."""

    def __init__(self, fetch: Callable[[FetchRequest], Awaitable[Fetched]] | None = None) -> None:
        self.api = MemoryApiServer()
        self.registry = MemoryRegistry(token=TOKEN)
        self.queue: WorkQueue[Key] = WorkQueue(base_delay_s=0.01)
        self.reconciler = Reconciler(self.api, fetch or self.registry, Metrics(), self.queue)
        self.workers: list[asyncio.Task[None]] = []

    def add(self, body: dict[str, Any], graph: bytes = MINI) -> Key:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        self.api.servegraphs[key] = body
        self.api.add_secret(meta["namespace"], "token", token=TOKEN)
        self.registry.graphs.setdefault(body["spec"]["source"]["url"], graph)
        self.reconciler.servegraph_changed(copy.deepcopy(body))
        return key

    def change(self, key: Key, edit: Callable[[dict[str, Any]], None]) -> None:
        body = self.api.servegraphs[key]
        edit(body)
        body["metadata"]["generation"] += 1
        self.reconciler.servegraph_changed(copy.deepcopy(body))

    def start(self) -> None:
        self.workers = [asyncio.create_task(run_worker(self.reconciler, self.queue)) for _ in range(WORKERS)]

    async def stop(self) -> None:
        for task in self.workers:
            task.cancel()
        await asyncio.gather(*self.workers, return_exceptions=True)

    def check(self, predicate: Callable[[], bool]) -> Callable[[], Awaitable[bool]]:
        async def checked() -> bool:
            return predicate()

        return checked

    def version_of(self, key: Key) -> str | None:
        return ((self.api.servegraphs[key].get("status") or {}).get("graph") or {}).get("version")


async def test_a_victims_download_starts_at_once_however_many_downloads_hang_elsewhere() -> None:
    """Twelve ServeGraphs in each of two namespaces whose registries never finish: the
    victim's new ServeGraph is downloaded and applied, and its other ServeGraph's image
    change applied, without waiting for any of them (before: about 12/2 times the deadline)."""
    hang = asyncio.Event()
    started: list[str] = []

    async def fetch(request: FetchRequest) -> Fetched:
        started.append(request.url)
        if "/hostile-" in request.url:
            await hang.wait()  # never set: a registry that holds the download to its deadline
        return await op.registry(request)

    op = Operator(fetch)
    running = op.add(servegraph("victim", "running"))
    await reconcile_through_downloads(op.reconciler, running)
    assert running in op.api.rayservices
    for ns in ("hostile-a", "hostile-b"):
        for i in range(12):
            op.add(servegraph(ns, f"g{i}"))
    op.start()
    try:
        await eventually(op.check(lambda: op.reconciler.downloads.running() == 4), within=10, interval=0.01)
        fresh = op.add(servegraph("victim", "fresh"))
        op.change(running, lambda b: b["spec"].setdefault("rayService", {}).update(image="ray:2"))
        await eventually(op.check(lambda: fresh in op.api.rayservices), within=10, interval=0.01, what="fresh applied")
        image = lambda: op.api.rayservices[running]["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]  # noqa: E731
        await eventually(
            op.check(lambda: image()["spec"]["containers"][0]["image"] == "ray:2"),
            within=10,
            interval=0.01,
            what="the image change applied",
        )
        assert url("victim-fresh") in started
        downloads = op.reconciler.downloads
        assert (downloads.running("hostile-a"), downloads.running("hostile-b"), downloads.waiting()) == (2, 2, 20)
    finally:
        await op.stop()
        op.reconciler.downloads.cancel_all()


async def test_a_download_cancelled_half_way_records_nothing_and_runs_again() -> None:
    """A refresh whose download is cancelled (the Lease lost: every in-flight download is
    dropped) is not done: the next reconcile downloads it again, and the new version runs."""
    op = Operator()
    key = op.add(servegraph("team", "g"), graph=version("1"))
    await reconcile_through_downloads(op.reconciler, key)
    assert op.version_of(key) == "1"

    gate = asyncio.Event()
    real = op.registry

    async def held(request: FetchRequest) -> Fetched:
        await gate.wait()
        return await real(request)

    op.reconciler.downloader.fetcher = held
    op.registry.graphs[url("team-g")] = version("2")
    op.change(key, lambda b: b["metadata"].setdefault("annotations", {}).update({REFRESH_ANNOTATION: "e1"}))
    await op.reconciler.reconcile(key)  # asks for the download, which waits at the registry
    assert op.reconciler.downloads.busy(key)
    op.reconciler.downloads.cancel_all()  # the Lease lost: stop_workers
    await op.reconciler.downloads.ended(key)
    memory = op.reconciler.cache.memory(key)
    assert memory.fetch.refresh is None, "the cancelled refresh was recorded as done"
    assert op.version_of(key) == "1"

    op.reconciler.downloader.fetcher = real  # the Lease regained (or a new leader): everything is queued
    op.reconciler.resync_all()
    await reconcile_through_downloads(op.reconciler, key)
    assert op.version_of(key) == "2", "the refresh was never done"
    assert op.reconciler.cache.memory(key).fetch.refresh == "e1"


async def test_a_download_never_holds_a_poll_in_a_busy_loop() -> None:
    """While a polling ServeGraph's download runs, its reconcile asks for no poll: the
    download's end queues it (a poll due in the past would requeue it at once, over and over)."""
    gate = asyncio.Event()
    op = Operator()
    body = servegraph("team", "g")
    body["spec"]["source"]["pollInterval"] = "1m"
    key = op.add(body, graph=MINI)
    await reconcile_through_downloads(op.reconciler, key)
    real = op.registry

    async def held(request: FetchRequest) -> Fetched:
        await gate.wait()
        return await real(request)

    op.reconciler.downloader.fetcher = held
    memory = op.reconciler.cache.memory(key)
    memory.fetch = replace(memory.fetch, poll_due=0.0)  # the poll is due
    delay = await op.reconciler.reconcile(key)
    assert op.reconciler.downloads.busy(key)
    assert delay is None or delay > 1.0, "a poll (due: 0 s) asked for while the download runs"
    gate.set()
    await op.reconciler.downloads.ended(key)


def source(name: str) -> Source:
    return Source(url=url(name), token=SecretKeyRef("ns", "token", "token"))


async def test_a_newer_request_drops_the_older_and_only_its_own_result_is_taken() -> None:
    ends: dict[str, asyncio.Event] = {}
    woken: list[Key] = []

    async def run(key: Key, memory: Memory, src: Source, refresh: str | None) -> Downloaded:
        await ends.setdefault(str(refresh), asyncio.Event()).wait()
        return Downloaded(memory.fetch, Outcome())

    downloads = Downloads(run, woken.append, per_namespace=1, total=4)
    key, memory = ("ns", "g"), Memory()
    downloads.start(key, memory, source("a"), "1")
    downloads.start(key, memory, source("a"), "1")  # the same request: kept, not started twice
    assert downloads.running("ns") == 1 and len(downloads) == 1
    downloads.start(key, memory, source("a"), "2")  # a newer refresh: the older is cancelled
    ends.setdefault("1", asyncio.Event()).set()
    ends.setdefault("2", asyncio.Event()).set()
    await downloads.ended(key)
    assert downloads.take(key, source("a"), "1") is None
    finished = downloads.take(key, source("a"), "2")
    assert finished is not None and finished.result is not None
    assert downloads.take(key, source("a"), "2") is None, "taken once"
    assert woken == [key] and len(downloads) == 0 and downloads.running() == 0


async def test_a_download_cancelled_before_it_ran_frees_its_place() -> None:
    """A task cancelled before its first step never enters its coroutine: its place is freed
    by the task's end, or the namespace would be one download short for ever."""
    gate = asyncio.Event()

    async def run(key: Key, memory: Memory, src: Source, refresh: str | None) -> Downloaded:
        await gate.wait()
        return Downloaded(memory.fetch, Outcome())

    downloads = Downloads(run, lambda key: None, per_namespace=1, total=1)
    downloads.start(("ns", "a"), Memory(), source("a"), None)  # handed out: a task, not yet run
    downloads.cancel(("ns", "a"))
    downloads.start(("ns", "b"), Memory(), source("b"), None)  # waits for the place
    assert (downloads.running("ns"), downloads.waiting()) == (0, 1)
    await eventually(
        lambda: _true(downloads.running("ns") == 1), within=5, interval=0.001, what="the cancelled one's place freed"
    )
    gate.set()
    await downloads.ended(("ns", "b"))
    assert downloads.take(("ns", "b"), source("b"), None) is not None


async def _true(value: bool) -> bool:
    return value
