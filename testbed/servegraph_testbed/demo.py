"""`make demo`: a published graph answers real requests on a real node, then changes.

The node tier of the test bed (etcd, kube-apiserver, controller-manager, scheduler, a
kubelet with containerd and the CNI bridge, kube-proxy, CoreDNS), KubeRay installed
from its own kustomize config and servegraph with `kubectl apply -k config/default` (two
replicas, leader election; the node tier's other tests install the Helm chart). The `mini` sample is published to an HTTPS graph registry that requires a
bearer token; a ServeGraph is applied; KubeRay starts real Ray pods; the demo asks the
graph's route until it answers. Then it publishes version 2 with the registry's publish
call, posts the "graph published" CloudEvent to the operator, and asks until the answer
changes, and calls it over gRPC through the serve Service's `serve-grpc` port.
Ctrl-C (or --check, at once) tears everything down and checks that nothing
was left behind: no process, container, mount, network namespace, veth, route,
cgroup or iptables rule.

    python -m servegraph_testbed.demo           # make demo
    python -m servegraph_testbed.demo --check   # make demo-check: exit 0 only if all was right
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from google.protobuf import text_format

from servegraph import grpc_client
from servegraph.render.serve_config import SERVE_GRPC_PORT
from servegraph.v1 import graph_pb2
from servegraph_testbed.node.routes import ask
from servegraph_testbed.node.stack import Stack
from servegraph_testbed.processes import tail

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "demo"
NAME = "mini"
ROUTE = "/sentiment"
APP = "sentiment"
QUESTION = {"text": "a fine day"}
V1_ANSWER = {"label": "neutral", "score": 0.0}  # "fine" is in neither default word list
V2_ANSWER = {"label": "positive", "score": 1.0}  # version 2 counts "fine" as positive
# Sized for the 2-CPU node (the sample leaves pod sizes to the cluster's defaults).
RAY_PODS = {
    "head": {"resources": {"requests": {"cpu": "200m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "3Gi"}}},
    "workers": {"resources": {"requests": {"cpu": "300m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "3Gi"}}},
}


def say(text: str = "") -> None:
    print(text, flush=True)


def graph(version: str) -> bytes:
    """config/samples/mini.txtpb; version 2 adds "fine" to the sentiment node's positive words."""
    g = text_format.Parse((ROOT / "config" / "samples" / "mini.txtpb").read_text(), graph_pb2.Graph())
    g.version = version
    if version != "1":
        g.applications[0].nodes["sentiment"].deployment.kwargs["positive"].value.list_value.extend(["fine", "great"])
    return g.SerializeToString()


async def _ask_until(url: str, want: dict[str, object], within: float) -> dict[str, object]:
    deadline = time.monotonic() + within
    last: object = None
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            status, body = await ask(url, QUESTION, limit_s=5)
            last = (status, body)
            if status == 200 and body == want:
                return body  # type: ignore[no-any-return]
        await asyncio.sleep(0.5)
    raise TimeoutError(f"no answer {want} from {url} within {within:.0f} s; last: {last}")


async def _demo(check: bool) -> int:
    iptables_before = _iptables()
    # The node tier's other tests run the Helm chart; the demo installs the other way users do.
    stack = Stack(install="kustomize")
    say("starting a one-node Kubernetes cluster (etcd, kube-apiserver, controller-manager, scheduler,")
    say("kubelet + containerd + CNI bridge, kube-proxy, CoreDNS), KubeRay (kustomize) and servegraph")
    say("(kubectl apply -k config/default) ...")
    failed = False
    cluster = stack.cluster
    try:
        await stack.start()
        say(
            f"  up in {stack.timings['servegraph ready']:.0f} s: "
            + ", ".join(f"{k} {v:.0f} s" for k, v in stack.timings.items())
        )
        say(f"  graph registry (HTTPS, bearer token): {stack.source_url(NAME)}")

        await stack.publish(NAME, graph("1"))
        say(f"\npublished {NAME} version 1; applying ServeGraph {NAMESPACE}/{NAME} ...")
        applied = time.monotonic()
        await asyncio.to_thread(stack.apply, stack.servegraph_manifest(NAMESPACE, NAME, NAME, RAY_PODS))
        url = await _wait_url(stack)
        answer = await _ask_until(url, V1_ANSWER, within=420)
        first_answer_s = time.monotonic() - applied
        say(f"  POST {url} {json.dumps(QUESTION)}  ->  {json.dumps(answer)}")
        say(f"  apply -> first correct answer: {first_answer_s:.1f} s")
        say("")
        say(stack.cp.kubectl("get", "servegraphs,rayservices,rayclusters,pods", "-n", NAMESPACE).stdout)

        await stack.publish(NAME, graph("2"))
        published = time.monotonic()
        refreshed = await stack.post_published_event(NAME)
        say(f"published version 2 (registry PUT) and posted the CloudEvent: {refreshed}")
        answer = await _ask_until(url, V2_ANSWER, within=300)
        say(f"  POST {url} {json.dumps(QUESTION)}  ->  {json.dumps(answer)}")
        say(f"  publish -> new answer: {time.monotonic() - published:.1f} s")
        say("")
        grpc_line = await _grpc_line(stack)
        say("reach the route yourself (from this machine):")
        say(f"  curl -s -X POST {url} -d '{json.dumps(QUESTION)}'")
        say(grpc_line)
        say(f"  export KUBECONFIG={stack.cp.kubeconfig('admin')}")
        say(f"  {stack.cp.binaries.kubectl} get servegraphs -n {NAMESPACE} -o yaml")
        if not check:
            say("Ctrl-C stops and removes everything.")
            await _until_interrupted()
    except Exception as e:
        failed = True
        say(f"\ndemo: FAILED: {e}")
        if cluster.control_plane is not None:
            say(tail(cluster.cp.component_log("kubelet"), 15))
    finally:
        say("\nstopping ...")
        await stack.stop()
    left = cluster.leftovers()
    if _iptables() != iptables_before:
        left.append("the host's iptables rules changed")
    if left:
        say("left behind:\n  " + "\n  ".join(left))
        return 1
    say("nothing left behind: no process, container, mount, network namespace, veth, route, cgroup or iptables rule")
    return 1 if failed else 0


async def _wait_url(stack: Stack, within: float = 420) -> str:
    """The serve Service appears when KubeRay has a serving cluster."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await asyncio.to_thread(stack.serve_url, NAMESPACE, NAME, ROUTE)
        except LookupError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)


async def _grpc_line(stack: Stack) -> str:
    """The `servegraph call` line for the graph's gRPC port, printed only once it answered.

    Through the same serve Service as the HTTP route (KubeRay adds the head's `serve-grpc`
    port to it). `mini`'s ingress is a class, which answers GraphService through the
    builder's subclass (`runtime/grpc_ingress.py`); an error is printed instead of the line.
    """
    service = f"{NAME}-serve-svc"
    target = f"{await asyncio.to_thread(stack.service_ip, NAMESPACE, service)}:{SERVE_GRPC_PORT}"
    deadline = time.monotonic() + 90
    while True:  # a client of a Service sends again what was lost (routes.py, `answer`)
        try:
            answer = await asyncio.to_thread(grpc_client.call, target, APP, QUESTION, timeout_s=30)
            break
        except grpc_client.CallError as e:
            if time.monotonic() > deadline:
                return f"  (gRPC {target} did not answer: {e})"
            say(f"  (gRPC {target}: {e}; sending again)")
            await asyncio.sleep(2)
    say(f"  gRPC GraphService.Call {target} application {APP} {json.dumps(QUESTION)}  ->  {json.dumps(answer)}")
    return f"  {ROOT / '.venv' / 'bin' / 'servegraph'} call --grpc {target} --app {APP} '{json.dumps(QUESTION)}'"


def _iptables() -> str:
    """The host's rules (the node's live in its own network namespace and must not leak)."""
    out = subprocess.run(["iptables-save"], capture_output=True, text=True, check=False).stdout
    return "\n".join(line for line in out.splitlines() if not line.startswith(("#", ":")))


async def _until_interrupted() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m servegraph_testbed.demo", description=__doc__)
    p.add_argument("--check", action="store_true", help="do not wait for Ctrl-C; exit 0 only if all went right")
    args = p.parse_args()
    try:
        return asyncio.run(_demo(args.check))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
