"""What a publish costs the replicas that serve: restarts and publish → settled, on a real Ray.

One local Ray (2.60, from PyPI) runs a composition graph of 4 applications x 4 nodes (an
ensemble router of a sentiment model, its tokenizer and a vote, 0.1 CPU each) deployed the
way KubeRay deploys it: the declarative Serve config, applied by the Serve controller. Three
publishes follow, each measured from the config being applied to the graph being settled
(every application RUNNING, every deployment with its one healthy replica, deployed after
the publish) or, for a `user_config` change, to the new answer over HTTP:

- only the version changes;
- one node's `user_config` changes (the sentiment threshold of one application);
- one node's resources change (one tokenizer's CPUs).

Twice, side by side: as servegraph renders now (the version in the routers' `user_config`),
and as it rendered before (the version in every application's `args`, which makes Ray
Serve rebuild every application on every publish). Replicas restarted are counted by Ray
Serve's replica ids.

Usage: python bench/restart_bench.py. Prints a Markdown table for BENCHMARKS.md.
"""

from __future__ import annotations

import json
import logging
import platform
import socket
import time
import urllib.request
from typing import Any

APPS = 4
MIXED = {"text": "good and great, but boring"}  # polarity 1/3: positive at 0.2, neutral at 0.5


def graph(version: str, threshold: float = 0.2, tokenizer_cpus: float = 0.1) -> Any:
    from servegraph.v1 import graph_pb2

    g = graph_pb2.Graph(name="composition", version=version, schema_version=1)
    for a in range(APPS):
        app = g.applications.add(name=f"a{a}", route_prefix=f"/a{a}", ingress="n0")
        ensemble = app.nodes["n0"].ensemble
        ensemble.members.add().id = "n1"
        ensemble.members.add().id = "n2"
        ensemble.combiner.id = "n3"
        model = app.nodes["n1"]
        model.deployment.import_path = "servegraph.examples:Sentiment"
        model.deployment.kwargs["tokenizer"].node.id = "n2"
        model.user_config["threshold"] = threshold if a == 0 else 0.2
        app.nodes["n2"].deployment.import_path = "servegraph.examples:Tokenizer"
        app.nodes["n3"].deployment.import_path = "servegraph.examples:MajorityVote"
        for node_id, node in app.nodes.items():
            node.resources.num_cpus = tokenizer_cpus if (a, node_id) == (0, "n2") else 0.1
    return g


def config(msg: Any, port: int, version_in_args: bool) -> dict[str, Any]:
    """The Serve config servegraph renders; with `version_in_args`, as the renderer did before."""
    from servegraph.dag.args import ROUTER_CONFIG_KEY
    from servegraph.graph.validate import to_model
    from servegraph.render.serve_config import render_serve_config

    model = to_model(msg)
    cfg = render_serve_config(model)
    cfg["http_options"] = {"host": "127.0.0.1", "port": port}
    if version_in_args:
        for app in cfg["applications"]:
            app["args"] = {"graph": {"name": model.name, "version": model.version}, **app["args"]}
            for d in app["deployments"]:
                if ROUTER_CONFIG_KEY in (d.get("user_config") or {}):
                    del d["user_config"]
    return cfg


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def replica_ids(client: Any) -> dict[tuple[str, str], tuple[str, ...]]:
    from servegraph.raydash.dashboard import parse_serve_details

    state = parse_serve_details(client.get_serve_details())
    return {(a.name, d.name): d.replica_ids for a in state.applications.values() for d in a.deployments}


def settled(client: Any, since: float) -> bool:
    doc = client.get_serve_details()
    apps = doc.get("applications") or {}
    if len(apps) != APPS:
        return False
    for app in apps.values():
        if app.get("status") != "RUNNING" or (app.get("last_deployed_time_s") or 0) < since:
            return False
        for dep in (app.get("deployments") or {}).values():
            live = [r for r in dep.get("replicas") or () if r.get("state") == "RUNNING"]
            if dep.get("status") != "HEALTHY" or len(dep.get("replicas") or ()) != 1 or len(live) != 1:
                return False
    return True


def label(port: int) -> str | None:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/a0", data=json.dumps(MIXED).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return str(json.loads(resp.read())["label"])
    except OSError:
        return None


def publish(client: Any, cfg: dict[str, Any], port: int, wait_label: str | None = None) -> float:
    from ray.serve.schema import ServeDeploySchema

    start = time.time()
    client.deploy_apps(ServeDeploySchema.model_validate(cfg))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        done = label(port) == wait_label if wait_label is not None else settled(client, start)
        if done:
            return time.time() - start
        time.sleep(0.1)
    raise RuntimeError("the graph did not settle within 300 s")


def run_mode(client: Any, port: int, version_in_args: bool) -> list[tuple[str, float, int]]:
    publish(client, config(graph("1"), port, version_in_args), port)
    while not settled(client, 0):
        time.sleep(0.2)
    rows = []
    cases = [
        ("only the version", graph("2"), None),
        ("one node's user_config", graph("3", threshold=0.5), "neutral"),
        ("one node's resources", graph("4", threshold=0.5, tokenizer_cpus=0.11), None),
    ]
    for name, msg, wait_label in cases:
        before = replica_ids(client)
        took = publish(client, config(msg, port, version_in_args), port, wait_label)
        while not settled(client, 0):  # a user_config case: count once replicas are settled too
            time.sleep(0.2)
        after = replica_ids(client)
        rows.append((name, took, sum(1 for k in before if before[k] != after.get(k))))
    client.delete_all_apps()
    return rows


def main() -> int:
    import ray
    from ray import serve
    from ray.serve.context import _get_global_client

    ray.init(num_cpus=4, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    try:
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        client = _get_global_client()
        before = run_mode(client, port, version_in_args=True)
        now = run_mode(client, port, version_in_args=False)
    finally:
        serve.shutdown()
        ray.shutdown()
    print(
        f"\nRay {ray.__version__}, Python {platform.python_version()}, {platform.machine()}, 16 nodes in 4 applications"
    )
    print(
        "\n| publish | before: replicas restarted | before: publish -> settled | now: replicas restarted | now: publish -> settled |"
    )
    print("|---|---:|---:|---:|---:|")
    for (name, t_old, r_old), (_, t_new, r_new) in zip(before, now, strict=True):
        print(f"| {name} | {r_old} of 16 | {t_old:.1f} s | {r_new} of 16 | {t_new:.1f} s |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
