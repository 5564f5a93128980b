"""Canaries on the real node (issue 46): KubeRay runs the Ray cluster, the operator moves the
weight from the routers' own evidence (no Prometheus: read through the serve Service), and
clients that check every answer see what a tenant's users would.

One ServeGraph serves the whole module (a Ray cluster takes minutes to start here); each
test publishes the next version and lets the operator canary it:
(a) a good version 10 % -> 50 % -> promoted: 0 failed requests, the split within 5 points of
    each weight, no base replica restarted, the canary's replicas kept through promotion;
(b) a version failing one request in ten: aborted at the first step, no person involved,
    the status naming the node;
(c) a version 3x slower: aborted on its p99;
(d) a mirror of 20 %: every answer from the live version, the copies' failures seen by no
    client, the canary aborted on them;
(e) the leader killed mid-canary: the new leader resumes the same step;
(f) a version failing one request in ten, judged on what Prometheus scraped (the operator
    given --prometheus-url), aborted.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from google.protobuf import text_format
from node_support import LoadLoop, deploy, discard, figure, servegraph, wait_rolled_out

from servegraph.v1 import graph_pb2
from servegraph_testbed.node.install import upgrade_servegraph
from servegraph_testbed.node.prometheus import Prometheus
from servegraph_testbed.node.stack import Stack
from servegraph_testbed.waiting import eventually

pytestmark = pytest.mark.timeout(1800)  # its waits (and the first test's module setup) pass 600 s under load
NAME = "canaried"
ROUTE = "/svc"
PAYLOAD = {"text": "canary"}
GRAPH = """
name: "canaried"
version: "VERSION"
schema_version: 1
applications {
  name: "svc"
  route_prefix: "/svc"
  ingress: "front"
  nodes { key: "front" value { sequence { steps { id: "model" } } resources { num_cpus: 0.1 } max_ongoing_requests: 64 } }
  nodes {
    key: "model"
    value {
      deployment {
        import_path: "servegraph.examples:Flaky"
        kwargs { key: "every" value { value { number_value: EVERY } } }
        kwargs { key: "delay_s" value { value { number_value: DELAY } } }
        kwargs { key: "tag" value { value { string_value: "vVERSION" } } }
      }
      resources { num_cpus: 0.1 }
      max_ongoing_requests: 64
    }
  }
}
"""
STEPS = [{"weight": 10, "pause": "20s"}, {"weight": 50, "pause": "20s"}]
ANALYSIS = {"interval": "5s", "minRequests": 40}
LOADS = 3
"""Clients at once: enough requests in a 20 s step for a split within 5 points."""


def version(v: str, every: int = 1_000_000, delay_s: float = 0.02) -> graph_pb2.Graph:
    text = GRAPH.replace("VERSION", v).replace("EVERY", str(every)).replace("DELAY", str(delay_s))
    return text_format.Parse(text, graph_pb2.Graph())


@dataclass
class Served:
    namespace: str
    registry_name: str
    url: str


@pytest.fixture(scope="module")
async def served(stack: Stack) -> AsyncIterator[Served]:
    namespace = "canary-node"
    rollout = {"progressDeadline": "10m", "canary": {"steps": STEPS, "analysis": ANALYSIS}}
    registry_name = await deploy(stack, namespace, NAME, version("1"), rollout)
    await wait_rolled_out(stack, namespace, NAME, "1", within=600)
    yield Served(namespace, registry_name, stack.serve_url(namespace, NAME, ROUTE))
    discard(stack, namespace)


async def canary(stack: Stack, served: Served) -> dict[str, Any]:
    sg = await servegraph(stack, served.namespace, NAME)
    return dict(((sg.get("status") or {}).get("rollout") or {}).get("canary") or {})


async def publish(stack: Stack, served: Served, graph: graph_pb2.Graph) -> float:
    await stack.publish(served.registry_name, graph.SerializeToString())
    await stack.post_published_event(served.registry_name)
    return time.monotonic()


def patch_canary(stack: Stack, served: Served, canary_spec: dict[str, Any]) -> None:
    """Replace the whole canary spec (a JSON patch: a merge patch would keep what an earlier
    test set and this one leaves out, such as a mirror)."""
    patch = [{"op": "replace", "path": "/spec/rollout/canary", "value": canary_spec}]
    stack.cp.kubectl("patch", "servegraph", NAME, "-n", served.namespace, "--type=json", "-p", json.dumps(patch))


async def canary_of(stack: Stack, served: Served, v: str, phases: tuple[str, ...]) -> dict[str, Any] | None:
    """The canary's state once it is version `v`'s and in one of `phases`: an earlier test's
    ended canary stays in the status (Aborted, Promoted) until the next one starts."""
    state = await canary(stack, served)
    return state if state.get("version") == v and state.get("phase") in phases else None


LIVE_STATES = ("RUNNING", "UPDATING")
"""A replica being reconfigured (a router's new routes: Serve's UPDATING) is the same process;
a restarted one has a new id."""
NOT_STOPPING = (*LIVE_STATES, "STARTING", "RECOVERING", "PENDING_MIGRATION")
"""A deployment at zero has no replica in any of these."""


def replicas(
    stack: Stack, namespace: str, states: tuple[str, ...] = LIVE_STATES
) -> dict[tuple[str, str], tuple[str, ...]]:
    """Ray Serve's replica ids per (application, deployment), from the head's dashboard."""
    path = f"/api/v1/namespaces/{namespace}/services/{NAME}-head-svc:dashboard/proxy/api/serve/applications/"
    doc = json.loads(stack.cp.kubectl("get", "--raw", path).stdout)
    return {
        (app_name, dep_name): tuple(
            sorted(r["replica_id"] for r in dep.get("replicas") or () if r.get("state") in states)
        )
        for app_name, app in (doc.get("applications") or {}).items()
        for dep_name, dep in (app.get("deployments") or {}).items()
    }


class Loads:
    """Several clients at once, every answer checked and kept with its time."""

    def __init__(self, url: str) -> None:
        self.loops = [LoadLoop(url, PAYLOAD) for _ in range(LOADS)]

    async def __aenter__(self) -> Loads:
        for loop in self.loops:
            await loop.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for loop in self.loops:
            await loop.__aexit__(*exc)

    @property
    def results(self) -> list[tuple[float, int, Any]]:
        return sorted(r for loop in self.loops for r in loop.results)

    def failures(self) -> list[tuple[float, int, Any]]:
        return [r for r in self.results if r[1] != 200]


class Steps:
    """When the status said each weight: (monotonic time, weight), polled each second."""

    def __init__(self, stack: Stack, served: Served) -> None:
        self.stack, self.served = stack, served
        self.seen: list[tuple[float, str, int]] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Steps:
        self._task = asyncio.create_task(self._poll())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    async def _poll(self) -> None:
        while True:
            try:
                state = await canary(self.stack, self.served)
            except Exception:  # one failed read is a gap in the record, not its end
                await asyncio.sleep(1)
                continue
            key = (str(state.get("phase")), int(state.get("weight") or 0))
            if not self.seen or self.seen[-1][1:] != key:
                self.seen.append((time.monotonic(), *key))
            await asyncio.sleep(1)

    def windows(self, phase: str = "Weighted") -> list[tuple[int, float, float]]:
        """(weight, from, to) of each weighted step, shrunk by 3 s at each end (routers
        reconfigure, and the status is polled, within that)."""
        out = []
        for (at, ph, weight), nxt in zip(self.seen, [*self.seen[1:], (time.monotonic(), "", 0)], strict=True):
            if ph == phase and nxt[0] - at > 8:
                out.append((weight, at + 3, nxt[0] - 3))
        return out


async def test_a_good_version_is_canaried_10_then_50_then_promoted(stack: Stack, served: Served) -> None:
    before = await asyncio.to_thread(replicas, stack, served.namespace)
    async with Loads(served.url) as load, Steps(stack, served) as steps:
        published = await publish(stack, served, version("2"))

        async def copies() -> dict[str, Any] | None:
            return await canary_of(stack, served, "2", ("Weighted", "Promoted"))

        await eventually(copies, within=300, interval=1, what="the canary's copies running, its first step")
        during = await asyncio.to_thread(replicas, stack, served.namespace)
        side = sorted({app for app, _ in during if "~" in app})
        assert len(side) == 1, f"one side application for the canary's copies: {during}"
        canary_replicas = {k: v for k, v in during.items() if k[0] == side[0]}
        sg = await wait_rolled_out(stack, served.namespace, NAME, "2", within=300)
        promoted = time.monotonic()

        async def old_at_zero() -> bool:  # Serve may first replace the old replica, then stop it
            now = await asyncio.to_thread(replicas, stack, served.namespace, NOT_STOPPING)
            return not now.get(("svc", "model"))

        await eventually(old_at_zero, within=300, interval=2, what="the old version's model at 0 replicas")
    after = await asyncio.to_thread(replicas, stack, served.namespace)

    figure(f"canary 10 -> 50 -> promoted: publish -> promoted {promoted - published:.1f} s; steps {steps.seen}")
    assert load.failures() == [], f"failed requests during the canary: {load.failures()[:5]}"
    for weight, start, end in steps.windows():
        inside = [body for at, status, body in load.results if start <= at <= end and status == 200]
        share = 100 * sum(1 for b in inside if (b or {}).get("node") == "v2") / max(1, len(inside))
        figure(f"canary at {weight} %: {share:.1f} % of {len(inside)} answers from v2")
        assert len(inside) >= 100, f"too few answers at {weight} % to measure the split: {len(inside)}"
        # each request is drawn at random: 4.5 binomial standard deviations, plus 2 points for the
        # requests in flight as the weight moved (a split at 0 % or at the other step's weight fails)
        bound = 450 * math.sqrt(weight / 100 * (1 - weight / 100) / len(inside)) + 2
        assert abs(share - weight) <= bound, f"at weight {weight} the new version answered {share:.1f} % (±{bound:.1f})"
    assert [w for w, _, _ in steps.windows()] == [10, 50]
    base = {k: v for k, v in before.items() if "~" not in k[0]}
    assert {k: during[k] for k in base} == base, "a base replica restarted before the promotion"
    assert {k: after.get(k) for k in canary_replicas} == canary_replicas, "a canary replica restarted at promotion"
    assert after.get(("svc", "model")) == (), "the old version's deployment still runs replicas"
    assert sg["status"]["layout"]["live"] == sg["status"]["rollout"]["digest"]


async def _aborted(stack: Stack, served: Served, v: str, within: float = 240) -> dict[str, Any]:
    async def ended() -> dict[str, Any] | None:
        return await canary_of(stack, served, v, ("Aborted",))

    return await eventually(ended, within=within, interval=1, what=f"the canary of version {v} aborted")


async def test_a_version_failing_one_request_in_ten_is_aborted_at_its_first_step(stack: Stack, served: Served) -> None:
    async with Loads(served.url) as load:
        published = await publish(stack, served, version("3", every=10))
        state = await _aborted(stack, served, "3")
        aborted = time.monotonic()
        await asyncio.sleep(3)

    async def recorded() -> dict[str, Any] | None:  # the history may be written by a later reconcile
        sg = await servegraph(stack, served.namespace, NAME)
        return sg if any(h.get("version") == "3" for h in sg["status"].get("history") or ()) else None

    sg = await eventually(recorded, within=120, interval=1, what="version 3 in the history")
    failed = [r for r in load.failures() if r[0] >= published]
    answered = [r for r in load.results if r[0] >= published]
    figure(
        f"10 % failing version: aborted {aborted - published:.1f} s after the publish at step {state.get('step')}; "
        f"{len(failed)} of {len(answered)} client requests failed (weight 10 % x 10 % x the step so far)"
    )
    assert state["step"] == 1, f"not aborted at the first step: {state}"
    assert 'node "model"' in state["message"], state
    assert sg["status"]["history"][1]["outcome"] == "RolledBack" and sg["status"]["history"][1]["version"] == "3"
    # Expected about 1 % of the requests while the step ran; 5 % of them bounds it with room.
    assert len(failed) <= max(10, 0.05 * len(answered)), f"{len(failed)} failures of {len(answered)}"
    await wait_rolled_out(stack, served.namespace, NAME, "2", within=120)


async def test_a_version_three_times_slower_is_aborted_on_its_p99(stack: Stack, served: Served) -> None:
    async with Loads(served.url) as load:
        published = await publish(stack, served, version("4", delay_s=0.12))
        state = await _aborted(stack, served, "4")
    figure(f"3x slower version: aborted {time.monotonic() - published:.1f} s after the publish: {state['message']}")
    assert "p99" in state["message"] and "at most 2x" in state["message"], state
    assert load.failures() == []
    await wait_rolled_out(stack, served.namespace, NAME, "2", within=120)


async def test_a_mirror_shows_the_new_version_copies_no_client_sees(stack: Stack, served: Served) -> None:
    patch_canary(stack, served, {"steps": [], "mirror": {"percent": 20, "pause": "20s"}, "analysis": ANALYSIS})
    async with Loads(served.url) as load:
        published = await publish(stack, served, version("5", every=2))  # half of what it gets fails
        state = await _aborted(stack, served, "5")
    mirrored = (state.get("evidence") or {}).get("mirrored") or {}
    live = (state.get("evidence") or {}).get("live") or {}
    figure(f"mirror 20 %: {mirrored} copies against {live} live requests; aborted: {state['message']}")
    answers = [body for at, status, body in load.results if at >= published and status == 200]
    assert load.failures() == [], "a copy's failure reached a client"
    assert {(b or {}).get("node") for b in answers} == {"v2"}, "a client was answered by the mirrored version"
    assert mirrored.get("requests", 0) >= 10 and mirrored.get("errors", 0) > 0
    share = 100 * mirrored["requests"] / max(1, live.get("requests", 0))
    assert 10 <= share <= 30, f"the new version received {share:.0f} % copies, not about 20 %"
    await wait_rolled_out(stack, served.namespace, NAME, "2", within=120)


async def test_a_new_leader_resumes_the_canary_at_its_step(stack: Stack, served: Served) -> None:
    assert stack.installed is not None
    patch_canary(stack, served, {"steps": [{"weight": 20, "pause": "60s"}], "analysis": ANALYSIS})
    async with Loads(served.url) as load:
        await publish(stack, served, version("6"))

        async def weighted() -> dict[str, Any] | None:
            return await canary_of(stack, served, "6", ("Weighted",))

        state = await eventually(weighted, within=300, interval=1, what="the canary's step")
        ns, deployment = stack.installed.operator_namespace, stack.installed.operator_deployment
        lease = stack.get("lease", ns, deployment)
        assert lease is not None
        leader = lease["spec"]["holderIdentity"].rsplit("_", 1)[0]
        killed, killed_at = time.monotonic(), datetime.now(UTC).replace(microsecond=0)
        stack.cp.kubectl("delete", "pod", leader, "-n", ns, "--grace-period=0", "--force")

        async def taken_over() -> bool:
            now = stack.get("lease", ns, deployment)
            return now is not None and not now["spec"]["holderIdentity"].startswith(leader)

        await eventually(taken_over, within=120, interval=1, what="a new leader")
        took_over = time.monotonic() - killed

        async def checked_by_the_new_leader() -> dict[str, Any] | None:  # evidence read after the kill
            now = await canary_of(stack, served, "6", ("Weighted", "Promoted"))
            at = ((now or {}).get("evidence") or {}).get("at")
            return now if at and datetime.fromisoformat(at) > killed_at else None

        resumed = await eventually(checked_by_the_new_leader, within=120, interval=1, what="the new leader's check")
        figure(
            f"leader killed mid-canary: new leader {took_over:.1f} s later, its first check of the canary "
            f"{time.monotonic() - killed:.1f} s later, at {resumed}"
        )
        assert resumed.get("stepStartedAt") == state["stepStartedAt"], "the step's clock started again"
        assert resumed.get("phase") in ("Weighted", "Promoted")
        sg = await wait_rolled_out(stack, served.namespace, NAME, "6", within=300)
    assert load.failures() == []
    assert sg["status"]["rollout"]["canary"]["phase"] == "Promoted"


async def test_a_failing_version_is_aborted_on_the_evidence_prometheus_holds(stack: Stack, served: Served) -> None:
    """(f) The operator given --prometheus-url (the chart's canary.prometheusUrl), as an
    administrator with a Prometheus that scrapes the Ray pods through the shipped PodMonitor:
    the evidence is read from it, not from the routers."""
    patch_canary(stack, served, {"steps": [{"weight": 20, "pause": "60s"}], "analysis": ANALYSIS})
    with Prometheus(stack.cluster, host=stack.net.host_ip) as prometheus:
        await asyncio.to_thread(upgrade_servegraph, stack.cluster, {"canary.prometheusUrl": prometheus.url})
        try:
            async with Loads(served.url):
                published = await publish(stack, served, version("7", every=10))
                state = await _aborted(stack, served, "7", within=300)
            evidence = state.get("evidence") or {}
            figure(
                f"Prometheus evidence: aborted {time.monotonic() - published:.1f} s after the publish: "
                f"{state['message']} ({evidence.get('canary')})"
            )
            assert evidence.get("source") == "prometheus", evidence
            assert (evidence.get("canary") or {}).get("requests", 0) > 0, f"judged on no weighted request: {evidence}"
            assert 'node "model"' in state["message"], state
            scraped = await asyncio.to_thread(
                prometheus.query, f'sum(ray_servegraph_requests_total{{namespace="{served.namespace}"}})'
            )
            assert scraped and float(scraped[0]["value"][1]) > 0, "Prometheus holds none of the routers' counts"
        finally:
            await asyncio.to_thread(upgrade_servegraph, stack.cluster, {"canary.prometheusUrl": ""})
    await wait_rolled_out(stack, served.namespace, NAME, "6", within=180)
