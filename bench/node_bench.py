"""The node tier, measured: how fast a graph serves and how updates behave under load.

On one real node (kubelet, containerd, KubeRay, Ray pods), for the `mini` sample:

- apply -> first correct answer, through servegraph (ServeGraph -> fetch -> render ->
  RayService) and through the same RayService written by hand (`servegraph render`
  output applied directly with kubectl): median of N each, and the ratio;
- publish -> new answer (registry PUT + "graph published" CloudEvent), median of N;
- failed requests during a Serve-only update, under a back-to-back request loop.

Prints a Markdown table for BENCHMARKS.md. Needs root (it starts a node).
Usage: python bench/node_bench.py [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "node"))

from node_support import RAY_PODS, TEXT, LoadLoop, deploy, mini  # noqa: E402

from servegraph_testbed.node.routes import ask  # noqa: E402
from servegraph_testbed.node.stack import Stack  # noqa: E402

V1 = {"label": "neutral", "score": 0.0}
V2 = {"label": "positive", "score": 1.0}


async def first_answer(stack: Stack, namespace: str, rayservice: str, want: object, since: float) -> float:
    while True:
        try:
            url = await asyncio.to_thread(stack.serve_url, namespace, rayservice, "/sentiment")
            status, body = await ask(url, TEXT, limit_s=5)
            if status == 200 and body == want:
                return time.monotonic() - since
        except Exception:  # not there yet
            pass
        await asyncio.sleep(0.25)


async def delete_namespace(stack: Stack, namespace: str) -> None:
    await asyncio.to_thread(stack.cp.kubectl, "delete", "namespace", namespace, "--timeout=300s")


async def via_servegraph(stack: Stack) -> float:
    ns = f"bench-sg-{uuid.uuid4().hex[:6]}"
    start = time.monotonic()
    await deploy(stack, ns, "mini", mini("1"))
    took = await first_answer(stack, ns, "mini", V1, start)
    await delete_namespace(stack, ns)
    return took


async def by_hand(stack: Stack) -> float:
    """The RayService servegraph would render, applied by hand: the floor of our path."""
    ns = f"bench-hand-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory() as tmp:
        graph = Path(tmp) / "mini.pb"
        graph.write_bytes(mini("1").SerializeToString())
        rendered = await asyncio.to_thread(
            _run,
            [sys.executable, "-m", "servegraph.cli", "render", str(graph), "--name", "mini", "--namespace", ns],
        )
    import yaml

    rs = yaml.safe_load(rendered)
    for group, pods in (("headGroupSpec", RAY_PODS["head"]), (None, RAY_PODS["workers"])):
        specs = [rs["spec"]["rayClusterConfig"][group]] if group else rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]
        for spec in specs:
            spec["template"]["spec"]["containers"][0]["resources"] = pods["resources"]
    await asyncio.to_thread(stack.cp.kubectl, "create", "namespace", ns)
    start = time.monotonic()
    await asyncio.to_thread(stack.apply, yaml.safe_dump(rs))
    took = await first_answer(stack, ns, "mini", V1, start)
    await delete_namespace(stack, ns)
    return took


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


async def update(stack: Stack) -> tuple[float, int, int]:
    """publish -> new answer, and failed requests during it (Serve-only change)."""
    ns = f"bench-up-{uuid.uuid4().hex[:6]}"
    registry_name = await deploy(stack, ns, "mini", mini("1"))
    start = time.monotonic()
    await first_answer(stack, ns, "mini", V1, start)
    url = await asyncio.to_thread(stack.serve_url, ns, "mini", "/sentiment")
    async with LoadLoop(url, TEXT) as load:
        await asyncio.sleep(3)
        published = time.monotonic()
        await stack.publish(registry_name, mini("2", positive=["fine"]).SerializeToString())
        await stack.post_published_event(registry_name)
        took = await first_answer(stack, ns, "mini", V2, published)
        await asyncio.sleep(3)
    await delete_namespace(stack, ns)
    return took, len(load.failures), len(load.results)


async def main(runs: int) -> None:
    async with Stack() as stack:
        print(f"stack up: {stack.timings}", flush=True)
        sg, hand, upd = [], [], []
        for i in range(runs):
            # Alternate which goes first: the first after a teardown shares the node with it.
            if i % 2:
                sg.append(await via_servegraph(stack))
                hand.append(await by_hand(stack))
            else:
                hand.append(await by_hand(stack))
                sg.append(await via_servegraph(stack))
            upd.append(await update(stack))
            print(f"run {i + 1}: by hand {hand[-1]:.1f} s, servegraph {sg[-1]:.1f} s, update {upd[-1]}", flush=True)
    med_sg, med_hand = statistics.median(sg), statistics.median(hand)
    print()
    print(f"machine: {platform.machine()}, {platform.python_version()}, runs: {runs}")
    print("| measure | median | runs |")
    print("|---|---|---|")
    print(f"| apply -> first correct answer, servegraph | {med_sg:.1f} s | {', '.join(f'{x:.1f}' for x in sg)} |")
    print(
        f"| apply -> first correct answer, RayService by hand | {med_hand:.1f} s | {', '.join(f'{x:.1f}' for x in hand)} |"
    )
    print(f"| ratio servegraph / by hand | {med_sg / med_hand:.3f} | |")
    print(
        f"| publish -> new answer | {statistics.median(u[0] for u in upd):.1f} s | {', '.join(f'{u[0]:.1f}' for u in upd)} |"
    )
    print(f"| failed requests during the Serve-only update | {sum(u[1] for u in upd)} of {sum(u[2] for u in upd)} | |")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=3)
    asyncio.run(main(p.parse_args().runs))
