"""What the node-tier tests share: graph variants, Ray pod sizes for a 2-CPU node,
waits on the real status, and a load loop that counts failed requests."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from google.protobuf import text_format
from prometheus_client.parser import text_string_to_metric_families
from support import SAMPLES

from servegraph.v1 import graph_pb2
from servegraph_testbed.node.prometheus import reader_token
from servegraph_testbed.node.routes import answer
from servegraph_testbed.node.stack import Stack
from servegraph_testbed.waiting import eventually

FIGURES: list[str] = []
"""Measured figures, printed at the end of the run (conftest) so every log carries them."""


def figure(text: str) -> None:
    FIGURES.append(text)
    print(text)


DISCARDED: list[str] = []
"""Namespaces a test is done with, still being deleted: the session checks they all went."""


def discard(stack: Stack, namespace: str) -> None:
    """Tear a test's namespace down without waiting for the namespace controller (10-16 s a
    test): its ServeGraphs, then its RayServices and RayClusters, so neither servegraph nor
    KubeRay makes a Ray pod again, then the pods at once (not their 30 s grace: the test is
    over), so the next test has the node's CPUs; the namespace goes in the background, and
    the session fails if it has not gone by its end (`wait_discarded`)."""
    kinds = "servegraphs.servegraph.io,rayservices.ray.io,rayclusters.ray.io"
    stack.cp.kubectl("delete", kinds, "--all", "-n", namespace, "--wait=false", check=False)
    stack.cp.kubectl(
        "delete", "pods", "--all", "-n", namespace, "--grace-period=0", "--force", "--wait=false", check=False
    )
    stack.cp.kubectl("delete", "namespace", namespace, "--ignore-not-found", "--wait=false", check=False)
    DISCARDED.append(namespace)


async def wait_discarded(stack: Stack, within: float = 180) -> None:
    """Every discarded namespace gone: a finalizer left behind or a stuck deletion fails here."""

    async def gone() -> bool:
        DISCARDED[:] = [ns for ns in DISCARDED if await asyncio.to_thread(stack.get, "namespace", "", ns)]
        assert not DISCARDED, f"still there: {DISCARDED}"
        return True

    await eventually(gone, within=within, interval=1, what="every test's namespace deleted after its test")


# The samples ask for realistic pods (a 2-CPU/8 GiB head, 4-CPU workers); this node has
# 2 CPUs in all. These overrides (spec.rayService) shrink the requests so two Ray
# clusters fit at once (a new-cluster upgrade), and give Ray 1 logical CPU per pod.
RAY_PODS: dict[str, Any] = {
    "head": {"resources": {"requests": {"cpu": "200m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "3Gi"}}},
    "workers": {"resources": {"requests": {"cpu": "300m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "3Gi"}}},
}
TEXT = {"text": "a fine day"}  # neutral with the default word lists; positive once "fine" is


def mini(
    version: str, *, positive: list[Any] | None = None, tokenizer: str | None = None, replicas: int = 1
) -> graph_pb2.Graph:
    """config/samples/mini with a version and, optionally, the sentiment node's word list
    (a Serve-only change: it lands in serveConfigV2, not in the Ray cluster's spec)."""
    graph = text_format.Parse((SAMPLES / "mini.txtpb").read_text(), graph_pb2.Graph())
    graph.version = version
    nodes = graph.applications[0].nodes
    if positive is not None:
        nodes["sentiment"].deployment.kwargs["positive"].value.list_value.extend(positive)
    if tokenizer is not None:
        nodes["tokenizer"].deployment.import_path = tokenizer
    nodes["sentiment"].scaling.num_replicas = replicas
    return graph


def with_gpu_application(graph: graph_pb2.Graph, version: str) -> graph_pb2.Graph:
    """`graph` plus an application whose node needs a GPU: a GPU worker group appears,
    so the Ray cluster's spec changes and KubeRay must build a new cluster."""
    out = graph_pb2.Graph()
    out.CopyFrom(graph)
    out.version = version
    app = out.applications.add(name="embed", route_prefix="/embed", ingress="embedder")
    node = app.nodes["embedder"]
    node.deployment.import_path = "servegraph.examples:Embedder"
    node.deployment.kwargs["dimensions"].value.number_value = 4
    node.resources.num_cpus = 0.25
    node.resources.num_gpus = 1
    node.scaling.num_replicas = 1
    return out


def with_custom_resource(graph: graph_pb2.Graph, version: str) -> graph_pb2.Graph:
    """`graph` whose tokenizer needs a custom Ray resource: the CPU group's `ray start`
    parameters change, so the existing worker group's spec does (KubeRay: a new cluster)."""
    out = graph_pb2.Graph()
    out.CopyFrom(graph)
    out.version = version
    out.applications[0].nodes["tokenizer"].resources.custom["fast-disk"] = 1
    return out


async def servegraph(stack: Stack, namespace: str, name: str) -> dict[str, Any]:
    obj = await asyncio.to_thread(stack.get, "servegraph", namespace, name)
    assert obj is not None, f"ServeGraph {namespace}/{name} is gone"
    return obj


async def reconciles(stack: Stack, namespace: str, name: str) -> float:
    """How many reconciles of one ServeGraph the leading operator has finished (its /metrics,
    read as Prometheus reads it: the pod's port, a token allowed `get` on /metrics).

    What proves that a trigger was handled, where the handling writes nothing: the count
    grows only once the reconcile the trigger queued has run to its end."""
    assert stack.installed is not None
    ns, lease_name = stack.installed.operator_namespace, stack.installed.operator_deployment
    lease = await asyncio.to_thread(stack.get, "lease", ns, lease_name)
    assert lease is not None, f"no Lease {ns}/{lease_name}"
    pod = await asyncio.to_thread(stack.get, "pod", ns, lease["spec"]["holderIdentity"].rsplit("_", 1)[0])
    assert pod is not None, "the Lease holder's pod is gone"
    if id(stack) not in _reader_tokens:
        _reader_tokens[id(stack)] = await asyncio.to_thread(reader_token, stack.cp)
    url = f"http://{pod['status']['podIP']}:8080/metrics"
    headers = {"Authorization": f"Bearer {_reader_tokens[id(stack)]}"}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session,
        session.get(url, headers=headers) as resp,
    ):
        assert resp.status == 200, f"/metrics: HTTP {resp.status}: {await resp.text()}"
        text = await resp.text()
    for family in text_string_to_metric_families(text):
        if family.name == "servegraph_graph_reconcile_duration_seconds":
            for sample in family.samples:
                if sample.name.endswith("_count") and sample.labels == {"namespace": namespace, "name": name}:
                    return sample.value
    return 0.0


_reader_tokens: dict[int, str] = {}
"""A metrics reader's token per node stack (minted once: TokenRequest, 24 h)."""


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == kind:
            return dict(c)
    return {}


async def wait_ready(stack: Stack, namespace: str, name: str, within: float = 300) -> dict[str, Any]:
    """The ServeGraph Ready=True; our Ready is computed from KubeRay's own status."""

    async def ready() -> dict[str, Any] | None:
        sg = await servegraph(stack, namespace, name)
        return sg if condition(sg, "Ready").get("status") == "True" else None

    return await eventually(ready, within=within, interval=1, what=f"ServeGraph {namespace}/{name} Ready")


async def wait_rolled_out(stack: Stack, namespace: str, name: str, version: str, within: float = 300) -> dict[str, Any]:
    """The rollout of `version` complete (Ready and stable): a rollback target from now on."""

    async def done() -> dict[str, Any] | None:
        sg = await servegraph(stack, namespace, name)
        rollout = (sg.get("status") or {}).get("rollout") or {}
        canary = rollout.get("canary") or {}
        assert rollout.get("phase") == "Serving" and rollout.get("version") == version, (
            f"rollout of {rollout.get('version')!r} {rollout.get('phase')}"
            + (
                f", canary {canary.get('phase')} step {canary.get('step')}: {canary.get('message', '')}"
                if canary
                else ""
            )
            + f"; Ready: {condition(sg, 'Ready').get('message', '')}"
        )
        return sg

    return await eventually(done, within=within, interval=1, what=f"version {version} rolled out")


async def deploy(
    stack: Stack, namespace: str, name: str, graph: graph_pb2.Graph, rollout: dict[str, Any] | None = None, **ray: Any
) -> str:
    """Publish `graph` and apply a ServeGraph for it; returns the graph's registry name.

    The rollout's progress deadline is long by default here: on a loaded 2-CPU node a new
    Ray cluster can take minutes, and only the rollout tests mean to see a deadline."""
    rollout = rollout if rollout is not None else {"progressDeadline": "20m"}
    registry_name = f"{namespace}-{name}"
    await stack.publish(registry_name, graph.SerializeToString())
    manifest = stack.servegraph_manifest(namespace, name, registry_name, {**RAY_PODS, **ray}, rollout)
    await asyncio.to_thread(stack.apply, manifest)
    return registry_name


@dataclass
class LoadLoop:
    """POSTs to a route back to back (one request in flight) and records every outcome.

    Counting starts at the route's first answer: a request sent in the instant KubeRay
    reports Ready can be lost inside the node before the serve Service routes at all
    (docs/testenv.md, "Requests right after Ready"), which says nothing about the change a
    test makes under load. Such losses are kept apart, in `lost_before_first_answer`.
    """

    url: str
    payload: Any
    results: list[tuple[float, int, Any]] = field(default_factory=list)
    lost_before_first_answer: list[str] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def __aenter__(self) -> LoadLoop:
        await answer(self.url, self.payload, lost=self.lost_before_first_answer)
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task

    async def _run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    async with session.post(self.url, json=self.payload) as resp:
                        text = await resp.text()
                        try:
                            body: Any = json.loads(text)
                        except ValueError:
                            body = text[:300]
                        self.results.append((started, resp.status, body))
                except (aiohttp.ClientError, TimeoutError) as e:
                    self.results.append((started, 0, repr(e)))
                await asyncio.sleep(0.05)

    def summary(self, since: float) -> str:
        """Outcomes in runs, with times relative to `since`: `+3.1s..+9.0s 503 x12`."""
        runs: list[list[Any]] = []
        for at, status, body in self.results:
            what = status if status != 200 else f"200 {body.get('label') if isinstance(body, dict) else body}"
            if runs and runs[-1][2] == what:
                runs[-1][1] = at
                runs[-1][3] += 1
            else:
                runs.append([at, at, what, 1, body])
        lost = (
            f"lost before the first answer: {self.lost_before_first_answer}; " if self.lost_before_first_answer else ""
        )
        return lost + "; ".join(
            f"{a - since:+.1f}s..{b - since:+.1f}s {w} x{n}"
            + (f" ({str(body)[:80]})" if not str(w).startswith("200") else "")
            for a, b, w, n, body in runs
        )

    @property
    def failures(self) -> list[tuple[float, int, Any]]:
        return [r for r in self.results if r[1] != 200]

    def answers(self, key: Callable[[Any], Any]) -> list[Any]:
        """The distinct successful answers, in the order they first appeared."""
        seen: list[Any] = []
        for _, status, body in self.results:
            if status == 200 and key(body) not in seen:
                seen.append(key(body))
        return seen

    async def until(self, check: Callable[[], bool], within: float, what: str) -> None:
        async def done() -> bool:
            return check()

        await eventually(done, within=within, interval=0.5, what=what)
