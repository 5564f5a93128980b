"""Two operator replicas from the Helm chart: when the leader dies, the standby takes over."""

from __future__ import annotations

import json
import time

from node_support import TEXT, deploy, figure, mini, servegraph, wait_ready

from servegraph_testbed.node.routes import ask
from servegraph_testbed.node.stack import Stack
from servegraph_testbed.waiting import eventually


async def test_a_killed_leader_is_replaced_by_the_standby_and_a_change_made_meanwhile_is_applied(
    stack: Stack, namespace: str
) -> None:
    assert stack.installed is not None
    ns, lease_name = stack.installed.operator_namespace, stack.installed.operator_deployment
    registry_name = await deploy(stack, namespace, "mini", mini("1"))
    await wait_ready(stack, namespace, "mini")
    identity, leader = _holder(stack, ns, lease_name)
    pods = _operator_pods(stack, ns)
    assert leader in pods and len(pods) == 2, (leader, pods)
    standby = next(p for p in pods if p != leader)

    # SIGKILL, as a crash or an OOM kill: the leader cannot release its Lease, so the
    # standby must wait for it to expire (15 s) before it acts. Then the pod goes for
    # good (a lost node, an eviction), so it cannot come back in place.
    killed_at = time.monotonic()
    stack.cluster.kill_container(ns, leader)
    stack.cp.kubectl("delete", "pod", leader, "-n", ns, "--grace-period=0", "--force")

    # The change arrives while nobody leads: a new version and its "published" event
    # (the events endpoint runs on every replica; the standby's answers). A connection
    # kube-proxy still sends to the dead pod times out after 3 s and is retried.
    await stack.publish(registry_name, mini("2", positive=["fine"]).SerializeToString())

    async def event_accepted() -> bool:
        return bool(await stack.post_published_event(registry_name))

    await eventually(event_accepted, within=60, interval=1, what="the events endpoint accepting the event")

    async def applied() -> bool:
        sg = await servegraph(stack, namespace, "mini")
        return (sg.get("status") or {}).get("graph", {}).get("version") == "2"

    await eventually(applied, within=120, interval=0.5, what="version 2 applied by the new leader")
    took = time.monotonic() - killed_at
    new_identity, new_leader = _holder(stack, ns, lease_name)
    assert new_identity != identity, "a new process holds the Lease"
    assert new_leader == standby, (leader, standby, new_leader)
    # The Lease lasts 15 s: a standby acting sooner would have run beside a live leader.
    assert took >= 10, f"change applied {took:.1f} s after the kill, before the old Lease expired"
    figure(f"leader SIGKILLed -> change applied by the standby: {took:.1f} s")

    await wait_ready(stack, namespace, "mini")
    url = stack.serve_url(namespace, "mini", "/sentiment")

    async def answers_v2() -> bool:
        return await ask(url, TEXT) == (200, {"label": "positive", "score": 1.0})

    await eventually(answers_v2, within=120, interval=1, what="v2's answer")
    stack.cluster.wait_rollout(ns, f"deployment/{lease_name}")  # the Deployment replaced the pod


def _holder(stack: Stack, namespace: str, name: str) -> tuple[str, str]:
    """(holder identity, its pod): identities are `<pod name>_<per-process suffix>`."""
    lease = stack.get("lease", namespace, name)
    assert lease is not None, f"no Lease {namespace}/{name}"
    identity: str = lease["spec"]["holderIdentity"]
    return identity, identity.rsplit("_", 1)[0]


def _operator_pods(stack: Stack, namespace: str) -> list[str]:
    out = stack.cp.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout
    return [p["metadata"]["name"] for p in json.loads(out)["items"] if not p["metadata"].get("deletionTimestamp")]
