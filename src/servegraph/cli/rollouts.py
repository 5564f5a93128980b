"""`servegraph diff` (what an upgrade will make KubeRay do), `servegraph rollback` and `servegraph restart`.

`diff` of two graph files needs nothing but the core; comparing with a live ServeGraph
(`sg/NAME`), `rollback` and `restart` talk to the cluster, with the `operator` extra. Only the
standard library at import time, so the CLI lists both without it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from servegraph.extras import needs_extra
from servegraph.names import GROUP, PLURAL, RESTARTED_AT_ANNOTATION, VERSION

LIVE_PREFIXES = ("sg/", "servegraph/", "servegraphs/")


def add_arguments(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "diff", help="what changes between two graphs, and whether KubeRay updates in place or starts a new cluster"
    )
    p.add_argument("old", help="a graph file, or sg/NAME for a live ServeGraph (its running RayService)")
    p.add_argument("new", type=Path, help="a graph file")
    p.add_argument("-n", "--namespace", default="default", help="namespace of sg/NAME")
    p.add_argument("--name", help="RayService name for two files (default: the new graph's name)")
    p.add_argument("--image", help="Ray image, for two files")
    p.add_argument("--kubeconfig")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    p.set_defaults(func=diff)

    p = subparsers.add_parser("rollback", help="run an earlier version of a ServeGraph (pins it in spec.rollout.pin)")
    p.add_argument("name", help="the ServeGraph")
    p.add_argument("-n", "--namespace", default="default")
    p.add_argument("--to", metavar="VERSION|DIGEST", help="a version or (a prefix of) a digest in its history")
    p.add_argument("--clear", action="store_true", help="remove the pin: follow the source again")
    p.add_argument("--kubeconfig")
    p.set_defaults(func=rollback)

    p = subparsers.add_parser(
        "restart", help="roll a ServeGraph's Ray cluster without downtime (a new cluster, traffic moved when Ready)"
    )
    p.add_argument("name", help="the ServeGraph")
    p.add_argument("-n", "--namespace", default="default")
    p.add_argument("--kubeconfig")
    p.set_defaults(func=restart)


# ---- diff ------------------------------------------------------------------------------


def diff(args: argparse.Namespace) -> int:
    from servegraph.graph import load_graph
    from servegraph.render import RayServiceOptions, render_rayservice, render_serve_config
    from servegraph.render.upgrade import predict

    new_graph = load_graph(args.new)
    old_config = None  # a live RayService's Serve config is known only as its text
    if args.old.startswith(LIVE_PREFIXES):
        old, options = asyncio.run(_live(args))
    else:
        old_graph = load_graph(Path(args.old))
        options = RayServiceOptions(name=args.name or new_graph.name, image=args.image)
        old = render_rayservice(old_graph, options)
        old_config = render_serve_config(old_graph)
    previous = (old or {}).get("spec", {}).get("rayClusterConfig")
    new = render_rayservice(new_graph, replace(options, previous_cluster=previous))
    prediction = predict(old, new, old_config=old_config, new_config=render_serve_config(new_graph))
    if args.output == "json":
        print(json.dumps(_as_json(prediction), indent=2))
        return 0
    print(f"upgrade: {prediction.kind} — {prediction.summary()}")
    for reason in prediction.reasons:
        print(f"  - {reason}")
    if prediction.applications:
        print("applications:")
    for app in prediction.applications:
        print(f"  {app.name}: {app.change}")
        for detail in app.details:
            print(f"    - {detail}")
    return 0


def _as_json(prediction: Any) -> dict[str, Any]:
    peak = prediction.extra_at_peak
    return {
        "kind": prediction.kind,
        "summary": prediction.summary(),
        "reasons": list(prediction.reasons),
        "extraAtPeak": {"pods": peak.pods, "cpus": peak.cpus, "memoryBytes": peak.memory_bytes, "gpus": peak.gpus},
        "applications": [
            {"name": a.name, "change": a.change, "details": list(a.details)} for a in prediction.applications
        ],
    }


async def _live(args: argparse.Namespace) -> tuple[dict[str, Any] | None, Any]:
    """The running RayService of sg/NAME and the render options its spec gives."""
    with needs_extra("operator"):
        from kubernetes_asyncio import client

        from servegraph.kube.client import connect
        from servegraph.operator.apply.serve_service import WIDENING
        from servegraph.operator.spec import owner_reference, parse_spec
    name = args.old.split("/", 1)[1]
    api = await connect(args.kubeconfig)
    try:
        custom = client.CustomObjectsApi(api)
        body = await _get(custom, GROUP, VERSION, args.namespace, PLURAL, name)
        if body is None:
            raise SystemExit(f"servegraph diff: ServeGraph {args.namespace}/{name} not found")
        # What would render, not what this cluster's operator allows: it enforces that itself.
        spec = parse_spec(body.get("spec") or {}, args.namespace, serve_service_types=WIDENING)
        options = spec.rayservice_options(name, args.namespace, owner_reference(body))
        rs_name = (body.get("status") or {}).get("rayServiceName") or options.name
        live = await _get(custom, "ray.io", "v1", args.namespace, "rayservices", rs_name)
    finally:
        await api.close()
    return live, options


async def _get(custom: Any, group: str, version: str, namespace: str, plural: str, name: str) -> dict[str, Any] | None:
    from kubernetes_asyncio.client.rest import ApiException

    try:
        resp = await custom.get_namespaced_custom_object(
            group, version, namespace, plural, name, _preload_content=False
        )
        raw = await resp.read()
        status, reason = resp.status, resp.reason
    except ApiException as exc:
        status, reason, raw = exc.status, exc.reason, b""
    # Without preloading, the client raises for no HTTP status: a 404's body is a Status object.
    if status == 404:
        return None
    if not 200 <= status <= 299:
        raise SystemExit(f"servegraph: cannot read {plural} {namespace}/{name}: HTTP {status} {reason}")
    data: dict[str, Any] = json.loads(raw)
    return data


# ---- rollback --------------------------------------------------------------------------


def rollback(args: argparse.Namespace) -> int:
    return asyncio.run(_rollback(args))


async def _rollback(args: argparse.Namespace) -> int:
    def decide(body: dict[str, Any]) -> tuple[dict[str, Any], str]:
        if args.clear:
            return {"spec": {"rollout": {"pin": None}}}, "unpinned: it follows its source again"
        entry = choose_version(body.get("status") or {}, args.to)  # LookupError: refused
        patch = {"spec": {"rollout": {"pin": {"digest": f"sha256:{entry['digest']}"}}}}
        return (
            patch,
            f"pinned to version {entry['version']!r} ({entry['digest'][:12]}); `--clear` follows the source again",
        )

    return await _edit(args, "rollback", decide)


async def _edit(
    args: argparse.Namespace, command: str, decide: Callable[[dict[str, Any]], tuple[dict[str, Any], str]]
) -> int:
    """Read the ServeGraph, let `decide` turn it into a merge patch and what to print (or refuse
    it with a LookupError), and send the patch: what `rollback` and `restart` share."""
    with needs_extra("operator"):
        from kubernetes_asyncio import client

        from servegraph.kube.client import connect
    api = await connect(args.kubeconfig)
    try:
        custom = client.CustomObjectsApi(api)
        body = await _get(custom, GROUP, VERSION, args.namespace, PLURAL, args.name)
        if body is None:
            print(f"servegraph {command}: ServeGraph {args.namespace}/{args.name} not found", file=sys.stderr)
            return 2
        try:
            patch, message = decide(body)
        except LookupError as exc:
            print(f"servegraph {command}: {exc}", file=sys.stderr)
            return 2
        await custom.patch_namespaced_custom_object(
            GROUP, VERSION, args.namespace, PLURAL, args.name, patch, _content_type="application/merge-patch+json"
        )
    finally:
        await api.close()
    print(f"ServeGraph {args.namespace}/{args.name} {message}")
    return 0


def choose_version(status: dict[str, Any], wanted: str | None) -> dict[str, Any]:
    """The history entry to pin: the given version or digest, else the last Ready one
    before what runs now. LookupError says what the history holds."""
    history = status.get("history") or []
    current = (status.get("rollout") or {}).get("digest")
    if wanted:
        digest = wanted.removeprefix("sha256:")
        matches = [
            h for h in history if h["version"] == wanted or (len(digest) >= 7 and h["digest"].startswith(digest))
        ]
        unique = {h["digest"]: h for h in matches}
        if len(unique) == 1:
            entry: dict[str, Any] = next(iter(unique.values()))
            if not entry.get("rollbackAvailable", True):
                raise LookupError(f"version {entry['version']!r} is in the history but its graph was too large to keep")
            return entry
        if len(unique) > 1:
            raise LookupError(f"{wanted!r} matches several versions: {', '.join(sorted(unique))}")
    else:
        for entry in history:
            if entry["digest"] != current and entry.get("readyAt") and entry.get("rollbackAvailable", True):
                return dict(entry)
    known = ", ".join(f"{h['version']} ({h['digest'][:12]}, {h['outcome']})" for h in history) or "nothing"
    what = f"no version or digest {wanted!r}" if wanted else "no earlier Ready version"
    raise LookupError(f"{what} in the history; it holds: {known}")


# ---- restart ---------------------------------------------------------------------------


def restart(args: argparse.Namespace) -> int:
    return asyncio.run(_restart(args))


async def _restart(args: argparse.Namespace) -> int:
    def decide(body: dict[str, Any]) -> tuple[dict[str, Any], str]:
        refused = restart_refused(body.get("spec") or {})
        if refused:
            raise LookupError(f"ServeGraph {args.namespace}/{args.name}: {refused}")
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        # The uid test makes the patch fail rather than restart a ServeGraph created again meanwhile.
        patch = {"metadata": {"uid": body["metadata"]["uid"], "annotations": {RESTARTED_AT_ANNOTATION: now}}}
        return patch, (
            f"restarting ({RESTARTED_AT_ANNOTATION}={now}): KubeRay starts a new Ray cluster and moves traffic "
            "to it when it is Ready (`servegraph status` shows the upgrade)"
        )

    return await _edit(args, "restart", decide)


def restart_refused(spec: dict[str, Any]) -> str | None:
    """Why a restart would do nothing, or None."""
    ray_service = spec.get("rayService") or {}
    if spec.get("suspend") or ray_service.get("suspend"):
        return "it is suspended (spec.suspend): no Ray cluster runs; resuming starts a new one"
    if ray_service.get("upgradeStrategy") == "None":
        return (
            "spec.rayService.upgradeStrategy is None: KubeRay never replaces a running Ray cluster; "
            "remove it (or set NewCluster) to restart without downtime"
        )
    return None
