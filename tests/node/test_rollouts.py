"""Rollouts on the real node: a failing version is rolled back (even across an operator
restart), and a manual rollback pins an earlier version (docs/rollouts.md)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Any

from node_support import (
    TEXT,
    LoadLoop,
    condition,
    deploy,
    figure,
    mini,
    reconciles,
    servegraph,
    wait_ready,
    wait_rolled_out,
)

from servegraph_testbed.node.routes import ask
from servegraph_testbed.node.stack import Stack
from servegraph_testbed.waiting import eventually


def _history(sg: dict[str, Any]) -> list[tuple[str, str]]:
    return [(h["version"], h["outcome"]) for h in (sg.get("status") or {}).get("history") or []]


async def test_a_failing_version_is_rolled_back_across_an_operator_restart(stack: Stack, namespace: str) -> None:
    assert stack.installed is not None
    registry_name = await deploy(stack, namespace, "mini", mini("1"))
    await wait_rolled_out(stack, namespace, "mini", "1")
    url = stack.serve_url(namespace, "mini", "/sentiment")

    async with LoadLoop(url, TEXT) as load:
        await load.until(lambda: len(load.results) >= 10, within=60, what="answers from v1")
        published = time.monotonic()
        # Version 2: Sentiment.__init__ raises (numbers in its word list).
        await stack.publish(registry_name, mini("2", positive=[1, 2]).SerializeToString())
        await stack.post_published_event(registry_name)

        async def v2_applied() -> bool:
            sg = await servegraph(stack, namespace, "mini")
            return (sg.get("status") or {}).get("rollout", {}).get("version") == "2"

        await eventually(v2_applied, within=60, interval=0.5, what="version 2 applied")
        # The operator restarts in the middle of the rollout: both replicas, new processes.
        ns, deployment = stack.installed.operator_namespace, stack.installed.operator_deployment
        stack.cp.kubectl("rollout", "restart", f"deployment/{deployment}", "-n", ns)

        async def rolled_back() -> dict[str, Any] | None:
            sg = await servegraph(stack, namespace, "mini")
            history = _history(sg)
            if history[:2] != [("1", "Serving"), ("2", "RolledBack")]:
                status = sg.get("status") or {}
                conds = [
                    (c["type"], c["status"], c["reason"], c["message"][:200]) for c in status.get("conditions", [])
                ]
                raise AssertionError(f"history {history}; rollout {status.get('rollout')}; conditions {conds}")
            return sg

        sg = await eventually(rolled_back, within=300, interval=1, what="v2 rolled back and v1 Ready")
        took = time.monotonic() - published
        await load.until(lambda: load.results[-1][1] == 200, within=60, what="answers again")
        await asyncio.sleep(5)

    figure(f"bad version -> rollback complete: {took:.1f} s; requests: {load.summary(published)}")
    assert sg["status"]["graph"]["version"] == "1"
    assert condition(sg, "Ready")["status"] == "True"
    progressing = condition(sg, "Progressing")
    assert progressing["reason"] == "RolledBack" and "rolled back to version '1'" in progressing["message"], progressing
    bad = next(h for h in sg["status"]["history"] if h["version"] == "2")
    assert "sentiment" in bad["message"] and "DEPLOY_FAILED" in bad["message"], bad
    assert load.answers(lambda b: b["label"]) == ["neutral"], "only v1 ever answered"
    # After the rollback, every request succeeded.
    assert not [r for r in load.results if r[0] > published + took and r[1] != 200]
    stack.cluster.wait_rollout(stack.installed.operator_namespace, f"deployment/{stack.installed.operator_deployment}")

    # The source still serves v2: another "published" event does not retry it. Proof the
    # event was handled: the registry saw the operator's request after it, and the leader
    # finished one more reconcile of this ServeGraph.
    handled_before = await reconciles(stack, namespace, "mini")
    assert stack.registry is not None
    requests_before = len(stack.registry.registry.requests)
    await stack.post_published_event(registry_name)

    async def event_handled() -> bool:
        asked = any(r["name"] == registry_name for r in stack.registry.registry.requests[requests_before:])
        return asked and await reconciles(stack, namespace, "mini") > handled_before

    await eventually(event_handled, within=60, interval=0.5, what="the published event's reconcile")
    rs = stack.get("rayservice", namespace, "mini")
    assert (
        rs is not None and "[1.0,2.0]" not in rs["spec"]["serveConfigV2"] and "[1,2]" not in rs["spec"]["serveConfigV2"]
    )
    assert await ask(url, TEXT) == (200, {"label": "neutral", "score": 0.0})


async def test_servegraph_rollback_pins_an_older_version_and_clear_follows_the_source(
    stack: Stack, namespace: str
) -> None:
    registry_name = await deploy(stack, namespace, "mini", mini("1"))
    await wait_ready(stack, namespace, "mini")
    await stack.publish(registry_name, mini("2", positive=["fine"]).SerializeToString())
    await stack.post_published_event(registry_name)
    url = stack.serve_url(namespace, "mini", "/sentiment")

    async def answers(label: str) -> bool:
        status, body = await ask(url, TEXT)
        return status == 200 and body["label"] == label

    await eventually(lambda: answers("positive"), within=180, interval=1, what="v2's answer")
    await wait_ready(stack, namespace, "mini")

    _cli(stack, "rollback", "mini", "-n", namespace, "--to", "1")
    sg = await servegraph(stack, namespace, "mini")
    assert sg["spec"]["rollout"]["pin"]["digest"].startswith("sha256:")
    await eventually(lambda: answers("neutral"), within=180, interval=1, what="v1's answer after the rollback")
    sg = await wait_ready(stack, namespace, "mini")
    assert sg["status"]["rollout"]["cause"] == "pin" and sg["status"]["graph"]["version"] == "1"

    _cli(stack, "rollback", "mini", "-n", namespace, "--clear")
    await eventually(lambda: answers("positive"), within=180, interval=1, what="v2's answer again")


def _cli(stack: Stack, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "servegraph.cli", *args, "--kubeconfig", str(stack.cp.kubeconfig("admin"))],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout
