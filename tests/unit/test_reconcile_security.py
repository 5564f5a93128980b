"""The reconcile against a hostile or careless tenant (issue 14), through its edges in memory.

The same defects are exercised on the real API server and registry in
tests/integration/test_security.py; here each rule is pinned down on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from memory_api import MemoryApiServer, MemoryRegistry
from reconcile_support import reconcile_through_downloads
from support import SAMPLES

from servegraph.names import Key
from servegraph.operator.fetch.parsing import GraphParser
from servegraph.operator.metrics import Metrics
from servegraph.operator.queue import WorkQueue
from servegraph.operator.reconcile import Reconciler, RetryLater
from servegraph.operator.run.worker import run_worker
from servegraph.source import Fetched, FetchRequest, Limits
from servegraph.v1 import graph_pb2
from servegraph_testbed.loopstall import LoopStall
from servegraph_testbed.waiting import eventually

NS = "team-a"
TOKEN = "s3cret"
MINI = (SAMPLES / "mini.pb").read_bytes()


def url(name: str) -> str:
    return f"https://registry.test/v1/graphs/{name}"


def servegraph(namespace: str, name: str, uid: str = "", generation: int = 1, **spec: Any) -> dict[str, Any]:
    source = {"url": url(name), "tokenSecretRef": {"name": "registry-token"}, **spec.pop("source", {})}
    return {
        "apiVersion": "servegraph.io/v1alpha1",
        "kind": "ServeGraph",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}", "generation": generation},
        "spec": {"source": source, **spec},
    }


class Clock:
    """The reconciler's monotonic time, moved by the test: no test waits out a backoff."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class World:
    """An API server, a registry, a reconciler and its queue, with helpers to act as the watches."""

    def __init__(
        self,
        fetcher: Callable[[FetchRequest], Awaitable[Fetched]] | None = None,
        api: MemoryApiServer | None = None,
        **kw: Any,
    ) -> None:
        self.api = api or MemoryApiServer()
        self.registry = MemoryRegistry(token=TOKEN)
        self.queue: WorkQueue[Key] = WorkQueue(base_delay_s=0.01)
        self.clock = Clock()
        self.reconciler = Reconciler(
            self.api, fetcher or self.registry, Metrics(), self.queue, monotonic=self.clock, **kw
        )

    def add(self, body: dict[str, Any], graph: bytes = MINI) -> Key:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        self.api.servegraphs[key] = body
        self.api.add_secret(meta["namespace"], "registry-token", token=TOKEN)
        self.registry.graphs.setdefault(body["spec"]["source"]["url"], graph)
        self.reconciler.servegraph_changed(copy.deepcopy(body))
        return key

    def condition(self, key: Key, type_: str) -> dict[str, Any]:
        return next(c for c in self.api.servegraphs[key]["status"]["conditions"] if c["type"] == type_)

    async def reconcile(self, key: Key) -> None:
        with contextlib.suppress(RetryLater):
            await reconcile_through_downloads(self.reconciler, key)

    def deliver_rayservice(self, namespace: str, name: str) -> None:
        self.reconciler.rayservice_changed(copy.deepcopy(self.api.rayservices[(namespace, name)]))


# -- 3. one tenant cannot starve the operator -------------------------------------------


async def test_one_namespace_cannot_take_every_download() -> None:
    """Six downloads of one namespace hang; two run (its share), and another namespace's
    ServeGraph is downloaded and applied meanwhile by the same four workers."""
    release = asyncio.Event()
    world: World

    async def fetcher(request: FetchRequest) -> Fetched:
        if "/greedy-" in request.url:
            await release.wait()
        return await world.registry(request)

    world = World(fetcher)
    greedy = [world.add(servegraph("greedy", f"greedy-{i}")) for i in range(6)]
    patient = world.add(servegraph("patient", "mini"))
    downloads = world.reconciler.downloads
    workers = [asyncio.create_task(run_worker(world.reconciler, world.queue)) for _ in range(4)]
    try:
        await eventually(applied(world, patient), within=10, interval=0.01, what="the patient namespace applied")
        assert (downloads.running("greedy"), downloads.waiting()) == (2, 4)
        assert sum(key in world.api.rayservices for key in greedy) == 0
        # Waiting with nothing to apply: no interim "not downloaded yet" status, no Event.
        assert [k for k in greedy if "status" in world.api.servegraphs[k]] == []
        assert world.api.calls.count("patch_servegraph_status") == 1, "the patient one's only"
        release.set()
        await eventually(applied(world, *greedy), within=10, interval=0.01, what="the greedy ones applied")
        assert world.api.calls.count("patch_servegraph_status") == 1 + len(greedy), "one status each: the applied one"
    finally:
        for task in workers:
            task.cancel()
    assert len(downloads) == 0


def applied(world: World, *keys: Key) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return all(key in world.api.rayservices for key in keys)

    return check


async def test_a_burst_in_one_namespace_is_downloaded_two_at_a_time_and_reconciled_twice_each() -> None:
    """Sixty ServeGraphs created at once in one namespace: two download at a time, and each
    is reconciled about twice (asking, then recording), never once per download finished
    before its own (quadratic: waking every waiting one per freed place took ~50,000
    reconciles for 1,000)."""
    gate = asyncio.Semaphore(0)
    world: World

    async def fetcher(request: FetchRequest) -> Fetched:
        await gate.acquire()
        return await world.registry(request)

    world = World(fetcher)
    runs: list[Key] = []
    reconcile = world.reconciler.reconcile

    async def counted(key: Key) -> float | None:
        runs.append(key)
        return await reconcile(key)

    world.reconciler.reconcile = counted  # type: ignore[method-assign]
    burst = [world.add(servegraph(NS, f"sg-{i:02d}")) for i in range(60)]
    downloads = world.reconciler.downloads
    workers = [asyncio.create_task(run_worker(world.reconciler, world.queue)) for _ in range(4)]
    try:

        async def asked() -> bool:
            return (downloads.running(NS), downloads.waiting()) == (2, 58)

        await eventually(asked, within=10, interval=0.01, what="every download asked for, two running")
        for done in range(1, 61):  # one download at a time ends, each while the rest wait
            gate.release()

            async def recorded(done: int = done) -> bool:
                return sum(key in world.api.rayservices for key in burst) == done

            await eventually(recorded, within=10, interval=0.005, what=f"{done} applied")
    finally:
        for task in workers:
            task.cancel()
    # Each: its creation and its download's end (120 in all).
    assert len(runs) <= 3 * len(burst), f"{len(runs)} reconciles for {len(burst)} ServeGraphs"
    assert world.api.calls.count("patch_servegraph_status") == len(burst)
    assert len(downloads) == 0


async def test_the_administrators_limits_cap_what_a_servegraph_asks() -> None:
    world = World(limits=Limits(max_bytes=4 * 1024 * 1024, deadline_s=20.0))
    key = world.add(servegraph(NS, "mini", source={"maxBytes": 268435456, "timeout": "10m"}))
    await world.reconcile(key)
    (request,) = world.registry.requests
    assert (request.max_bytes, request.timeout_s) == (4 * 1024 * 1024, 20.0)


async def test_a_hostile_graph_is_parsed_without_stalling_the_loop() -> None:
    """200,000 labels in 2.7 MB: seconds of parsing, which on the loop stopped everything,
    the Lease renewal included. In the child process the loop keeps ticking."""
    hostile = graph_pb2.Graph.FromString(MINI)
    for i in range(200_000):
        hostile.labels[f"l{i}"] = "v"
    parser = GraphParser()
    await parser.start()
    world = World(parser=parser.parse)
    key = world.add(servegraph(NS, "mini"), graph=hostile.SerializeToString())
    try:
        async with LoopStall() as stall:
            await world.reconcile(key)
    finally:
        await parser.close()
    valid = world.condition(key, "GraphValid")
    assert (valid["status"], valid["reason"]) == ("False", "InvalidGraph")
    assert "200000 labels, over the limit of 64" in valid["message"]
    assert stall.worst_ms < 500, f"the event loop stalled {stall.worst_ms:.0f} ms while the graph was parsed"


# -- 4. it takes over nothing it does not own ------------------------------------------------


async def test_a_rayservice_made_by_hand_is_not_taken_over() -> None:
    world = World()
    hand_made = {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {
            "name": "mini",
            "namespace": NS,
            "managedFields": [{"manager": "kubectl-create"}, {"manager": "kuberay-operator", "subresource": "status"}],
        },
        "spec": {"serveConfigV2": "applications: []\n"},
    }
    world.api.rayservices[(NS, "mini")] = copy.deepcopy(hand_made)
    key = world.add(servegraph(NS, "mini"))
    with pytest.raises(RetryLater):
        await reconcile_through_downloads(world.reconciler, key)
    assert "apply_rayservice" not in world.api.calls
    assert not {"create_configmap", "patch_configmap"} & set(world.api.calls), (
        "no rollout (and no kept graph) for someone else's RayService"
    )
    assert world.api.rayservices[(NS, "mini")] == hand_made
    ready = world.condition(key, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Conflict")
    assert "written by kubectl-create)" in ready["message"], "who made it; KubeRay only wrote its status"
    assert world.condition(key, "Applied")["reason"] == "Conflict"


async def test_two_servegraphs_naming_one_rayservice_never_flip_it() -> None:
    world = World()
    first = world.add(servegraph(NS, "a", rayService={"name": "shared"}))
    second = world.add(servegraph(NS, "b", rayService={"name": "shared"}))
    await world.reconcile(first)
    world.deliver_rayservice(NS, "shared")
    for _ in range(3):
        await world.reconcile(second)
        await world.reconcile(first)
        world.deliver_rayservice(NS, "shared")
    assert world.api.calls.count("apply_rayservice") == 1
    assert world.api.rayservices[(NS, "shared")]["metadata"]["ownerReferences"][0]["name"] == "a"
    ready = world.condition(second, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "Conflict")
    assert f"ServeGraph {NS}/a" in ready["message"]
    # A new operator process (no claims in memory) sees the owner on the object itself.
    fresh = Reconciler(world.api, world.registry, Metrics(), WorkQueue())
    fresh.servegraph_changed(copy.deepcopy(world.api.servegraphs[second]))
    with pytest.raises(RetryLater):
        await reconcile_through_downloads(fresh, second)
    assert world.api.calls.count("apply_rayservice") == 1
    assert f"controlled by ServeGraph {NS}/a" in world.condition(second, "Ready")["message"]


# -- 5. every failure is a condition and a retry ------------------------------------------------


@pytest.mark.parametrize(
    "failure",
    [
        ValueError("Port out of range 0-65535"),
        ssl.SSLError(9, "[X509: NO_CERTIFICATE_OR_CRL_FOUND] no certificate or crl found"),
        aiohttp.ClientConnectionError("Connection reset by peer"),
        OSError(104, "Connection reset by peer"),
    ],
    ids=["bad-port", "broken-ca-bundle", "client-error", "os-error"],
)
@pytest.mark.parametrize("where", ["download", "secret"])
async def test_an_unexpected_failure_is_a_condition_and_a_retry(failure: Exception, where: str) -> None:
    failing = True
    world: World

    async def fetcher(request: FetchRequest) -> Fetched:
        if failing and where == "download":
            raise failure
        return await world.registry(request)

    api = MemoryApiServer()
    if where == "secret":
        real = api.read_secret_data

        async def read_secret_data(namespace: str, name: str) -> dict[str, str]:
            if failing:
                raise failure
            return await real(namespace, name)

        api.read_secret_data = read_secret_data  # type: ignore[method-assign]
    world = World(fetcher, api)
    key = world.add(servegraph(NS, "mini"))
    with pytest.raises(RetryLater):
        await reconcile_through_downloads(world.reconciler, key)
    fetched = world.condition(key, "Fetched")
    assert fetched["status"] == "False" and fetched["reason"] == "InternalError"
    assert type(failure).__name__ in fetched["message"]
    failing = False
    await world.reconcile(key)  # an event before the retry is due: no download
    assert world.registry.requests == [], "downloaded again before the backoff had passed"
    world.clock.now += world.queue.min_retry_delay_s  # the earliest the queue's retry comes
    await world.reconcile(key)
    assert world.condition(key, "Fetched")["reason"] == "Downloaded", "the failed download was never tried again"
    assert (NS, "mini") in world.api.rayservices


# -- 7. deleted or replaced while downloading ------------------------------------------------


@pytest.mark.parametrize("then", ["deleted", "replaced"])
async def test_a_servegraph_gone_while_its_graph_downloads_gets_nothing_written(then: str) -> None:
    """The download of a ServeGraph deleted (or deleted and made again) meanwhile is dropped:
    nothing of it is recorded, nothing written for the old object."""
    world: World
    tricked = False

    async def fetcher(request: FetchRequest) -> Fetched:
        nonlocal tricked
        if not tricked:
            tricked = True
            body = world.api.servegraphs.pop((NS, "mini"))
            world.reconciler.servegraph_changed(copy.deepcopy(body), deleted=True)  # the watch, meanwhile
            if then == "replaced":
                world.add(servegraph(NS, "mini", uid="uid-new"))
        return await world.registry(request)

    world = World(fetcher)
    key = world.add(servegraph(NS, "mini"))
    await world.reconciler.reconcile(key)  # asks for the download
    await world.reconciler.downloads.ended(key)
    assert tricked and world.api.writes() == [], world.api.calls
    assert world.api.rayservices == {}
    assert world.reconciler.downloads.take(key, world.reconciler.cache.memory(key).fetch.source, None) is None
    if then == "replaced":  # the new object downloads its own graph, from scratch
        assert world.reconciler.cache.memory(key).good is None
        await world.reconcile(key)
        assert world.api.rayservices[key]["metadata"]["ownerReferences"][0]["uid"] == "uid-new"


# -- 9. a condition's generation is the one it was computed for --------------------------------


async def test_conditions_keep_the_generation_they_were_computed_for() -> None:
    world = World()
    key = world.add(servegraph(NS, "mini"))
    await world.reconcile(key)
    body = world.api.servegraphs[key]
    assert {c["observedGeneration"] for c in body["status"]["conditions"]} == {1}

    # Generation 2 points at another URL, whose download fails.
    body["metadata"]["generation"] = 2
    body["spec"]["source"]["url"] = url("missing")
    world.reconciler.servegraph_changed(copy.deepcopy(body))
    await world.reconcile(key)
    generations = {c["type"]: (c["observedGeneration"], c["status"]) for c in body["status"]["conditions"]}
    assert generations["Fetched"] == (2, "False")
    assert generations["GraphValid"] == (1, "True"), "the old graph's validity must not read as the new URL's"
    assert body["status"]["observedGeneration"] == 2

    # Generation 3 only changes the image: the graph's conditions still answer for it.
    body["metadata"]["generation"] = 3
    body["spec"]["source"]["url"] = url("mini")
    world.reconciler.servegraph_changed(copy.deepcopy(body))
    await world.reconcile(key)
    body["metadata"]["generation"] = 4
    body["spec"]["rayService"] = {"image": "example.com/ray:4"}
    world.reconciler.servegraph_changed(copy.deepcopy(body))
    await world.reconcile(key)
    assert {c["observedGeneration"] for c in body["status"]["conditions"]} == {4}


# -- 10. per-object state does not outlive its objects ------------------------------------------


async def test_nothing_grows_as_objects_come_and_go() -> None:
    world = World()
    keys = [world.add(servegraph(f"ns-{i % 7}", f"sg-{i}")) for i in range(150)]
    for key in keys:
        await world.reconcile(key)
        world.deliver_rayservice(*key)
    assert world.reconciler.cache.sizes()["rayservices"] == 150
    for key in keys:
        rs = world.api.rayservices.pop(key)
        world.reconciler.rayservice_changed(rs, deleted=True)
        world.reconciler.servegraph_changed(world.api.servegraphs.pop(key), deleted=True)
    assert world.reconciler.cache.sizes() == {
        "servegraphs": 0,
        "memory": 0,
        "rayservices": 0,
        "claims": 0,
        "urls": 0,
        "stamps": 0,
    }
    assert len(world.reconciler.downloads) == 0
    assert len(world.reconciler.secrets) == 7  # one token Secret per namespace, kept 10 s
    world.reconciler.secrets.ttl_s = 0.0
    await world.reconciler.secrets.get("ns-0", "registry-token")
    assert len(world.reconciler.secrets) == 1, "expired copies are dropped as new ones are kept"


# -- issue 21, item 3: the status is no oracle for what an endpoint answers ---------------


@pytest.mark.parametrize("pinned", [True, False], ids=["sha256-pinned", "unpinned"])
async def test_the_status_never_says_the_digest_or_size_of_what_is_not_a_graph(pinned: bool) -> None:
    """A 6-digit answer from an internal endpoint: with its digest or its length in the status,
    a tenant brute-forces it offline in under a second."""
    secret = b"482915"
    world = World()
    source = {"sha256": "0" * 64} if pinned else {}
    key = world.add(servegraph(NS, "probe", source=source), graph=secret)
    await world.reconcile(key)
    status = str(world.api.servegraphs[key]["status"])
    assert hashlib.sha256(secret).hexdigest() not in status
    assert f"{len(secret)} bytes" not in status
    fetched = world.condition(key, "Fetched")
    if pinned:
        assert (fetched["reason"], fetched["message"]) == (
            "DigestMismatch",
            f"{url('probe')} served content that does not match the pinned sha256 {'0' * 64}",
        )
    else:
        assert (fetched["reason"], fetched["message"]) == ("Downloaded", f"downloaded from {url('probe')}")
        assert world.condition(key, "GraphValid")["reason"] == "InvalidGraph"


async def test_a_valid_graph_is_reported_with_its_size() -> None:
    world = World()
    key = world.add(servegraph(NS, "mini"))
    await world.reconcile(key)
    assert world.condition(key, "Fetched")["message"] == f"downloaded {len(MINI)} bytes from {url('mini')}"
