"""`servegraph diff`: what changes between two graphs, and what KubeRay will do about it.

A CI gate, as `diff` and `kubectl diff` are: exit 0 when nothing changes, 1 when
something does, 2 when an input is invalid, 3 when the cluster cannot be read. A new
graph version alone is no change: the routers' `user_config` carries the version (so
their metrics and spans name it), and that reaches them without a restart; the diff
says the version moved and leaves it out of the changes.

Two files need nothing but the core; `sg/NAME` compares with the live RayService of a
ServeGraph (the `operator` extra), whose Serve config is known only as its text, read
back by `render.serve_text` (0.17 s at 10,000 nodes; libyaml took 2.8 s).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from servegraph.cli import kubeconfig
from servegraph.cli.common import EXIT_DIFFERENT, EXIT_INVALID, EXIT_OK, Failure, add_output, command, emit, name_of
from servegraph.extras import needs_extra
from servegraph.names import GROUP, PLURAL, VERSION

LIVE_PREFIXES = ("sg/", "servegraph/", "servegraphs/")


def add_arguments(sub: Any) -> None:
    p = command(
        sub,
        "diff",
        help="what changes between two graphs, and whether KubeRay updates in place or starts a new cluster",
        description="Compare OLD with NEW per application and deployment, and predict what KubeRay does "
        "when NEW is applied. Exit 0: no change (a new graph version alone is none); 1: changes; "
        "2: an invalid input; 3: the cluster could not be read.",
        examples=[
            "servegraph diff old.pb new.pb",
            "servegraph diff sg/fraud new.pb -n team-a -o json",
        ],
    )
    p.add_argument("old", help="a graph file, or sg/NAME for a live ServeGraph (its running RayService)")
    p.add_argument("new", help="a graph file, or - for stdin")
    p.add_argument("--name", help="RayService name for two files (default: the new graph's name)")
    p.add_argument("--image", help="Ray image, for two files")
    p.add_argument("--pods", metavar="FILE", help="for two files: the ServeGraph whose pods both render for")
    kubeconfig.add_arguments(p)
    add_output(p, ("text", "json", "yaml"), "text")
    p.set_defaults(func=diff)


@dataclass(frozen=True)
class Versions:
    old: str | None
    new: str | None
    carried: bool
    """Whether the routers' user_config carries the version (a graph without routers renders none)."""


def diff(args: argparse.Namespace) -> int:
    from servegraph.cli.graphs import load
    from servegraph.cli.pods import read_pods
    from servegraph.render import RayServiceOptions, render_rayservice, render_serve_config
    from servegraph.render.serve_text import read_config
    from servegraph.render.upgrade import predict

    new_graph = load(args.new).graph
    if args.old.startswith(LIVE_PREFIXES):
        if args.pods:
            raise Failure("error: --pods is for two files: sg/NAME renders with the ServeGraph's own pods")
        old, options, old_version = asyncio.run(_live(args))
        old_config = read_config(((old or {}).get("spec") or {}).get("serveConfigV2") or "")
        old_version = old_version or _version(old_config)
    else:
        old_graph = load(args.old).graph
        options = RayServiceOptions(name=args.name or new_graph.name, image=args.image)
        if args.pods:
            (pods, *more) = read_pods(args.pods, new_graph.name)
            if more:
                raise Failure(f"error: {name_of(args.pods)}: holds {1 + len(more)} ServeGraphs; diff takes one")
            options = replace(pods.options, name=args.name or pods.options.name, image=args.image or pods.options.image)
        old = _render(render_rayservice, old_graph, options, args.old)
        old_config, old_version = render_serve_config(old_graph), old_graph.version
    previous = (old or {}).get("spec", {}).get("rayClusterConfig")
    new = _render(render_rayservice, new_graph, replace(options, previous_cluster=previous), args.new)
    new_config = render_serve_config(new_graph)
    versions = Versions(old_version, new_graph.version, _version(new_config) is not None)
    prediction = predict(old, new, old_config=_anonymous(old_config), new_config=_anonymous(new_config))
    same_serve = _anonymous(old_config) == _anonymous(new_config)
    changed = prediction.kind not in ("NoChange", "ServeConfigInPlace") or not same_serve
    settings = _settings_changed(old_config, new_config)
    if args.output != "text":
        emit(_document(prediction, changed, versions, settings), args.output)
    else:
        _print(prediction, changed, versions, settings)
    return EXIT_DIFFERENT if changed else EXIT_OK


def _render(render: Any, graph: Any, options: Any, where: str) -> dict[str, Any]:
    from servegraph.graph import GraphError

    try:
        manifest: dict[str, Any] = render(graph, options)
    except GraphError as exc:
        from servegraph.cli.graphs import Invalid

        raise Invalid(name_of(where), list(exc.problems)) from None
    return manifest


def _anonymous(config: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The config without the graph identity routers carry in their user_config: a version
    bump alone changes nothing a replica runs."""
    from servegraph.dag.args import ROUTER_CONFIG_KEY

    if config is None:
        return None
    apps = []
    for app in config.get("applications") or []:
        deployments = []
        for d in app.get("deployments") or []:
            user = d.get("user_config") if isinstance(d, Mapping) else None
            if isinstance(user, Mapping) and ROUTER_CONFIG_KEY in user:
                rest = {k: v for k, v in user.items() if k != ROUTER_CONFIG_KEY}
                inner = {k: v for k, v in user[ROUTER_CONFIG_KEY].items() if k != "graph"}
                d = {k: v for k, v in d.items() if k != "user_config"}
                if rest or inner:
                    d["user_config"] = {**rest, **({ROUTER_CONFIG_KEY: inner} if inner else {})}
            deployments.append(d)
        apps.append({**app, "deployments": deployments})
    return {**config, "applications": apps}


def _version(config: Mapping[str, Any] | None) -> str | None:
    """The graph version a Serve config's routers carry (None when it has no router)."""
    from servegraph.dag.args import graph_identity

    for app in (config or {}).get("applications") or []:
        for d in app.get("deployments") or []:
            _, version = graph_identity((d or {}).get("user_config"))
            if version is not None:
                return version
    return None


def _settings_changed(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> list[str]:
    """Serve's cluster-wide options (not per application) that differ."""
    keys = dict.fromkeys([*(old or {}), *(new or {})])
    return [k for k in keys if k != "applications" and (old or {}).get(k) != (new or {}).get(k)]


def _document(prediction: Any, changed: bool, versions: Versions, settings: list[str]) -> dict[str, Any]:
    peak = prediction.extra_at_peak
    return {
        "changed": changed,
        "kind": prediction.kind if changed else "NoChange",
        "summary": prediction.summary() if changed else "no change",
        "version": {"old": versions.old, "new": versions.new},
        "reasons": list(prediction.reasons),
        "serveSettings": settings,
        "extraAtPeak": {"pods": peak.pods, "cpus": peak.cpus, "memoryBytes": peak.memory_bytes, "gpus": peak.gpus},
        "applications": [
            {"name": a.name, "change": a.change, "details": list(a.details)} for a in prediction.applications
        ],
    }


def _print(prediction: Any, changed: bool, versions: Versions, settings: list[str]) -> None:
    moved = versions.old is not None and versions.old != versions.new
    version = f"graph version {versions.old!r} -> {versions.new!r}" if moved else ""
    if not changed:
        if versions.carried:
            tail = " (the routers' user_config carries it: applied in place, no replica restarted)"
        else:
            tail = " (no router to carry it: nothing rendered changes)"
        print(f"no change{': ' + version + tail if moved else ''}")
        return
    print(f"upgrade: {prediction.kind} — {prediction.summary()}")
    if version:
        print(f"  - {version}")
    for reason in prediction.reasons:
        print(f"  - {reason}")
    for setting in settings:
        print(f"  - Serve's {setting} changed")
    if prediction.applications:
        print("applications:")
    for app in prediction.applications:
        print(f"  {app.name}: {app.change}")
        for detail in app.details:
            print(f"    - {detail}")


async def _live(args: argparse.Namespace) -> tuple[dict[str, Any] | None, Any, str | None]:
    """The running RayService of sg/NAME, the render options its spec gives, and the version
    its status says runs."""
    with needs_extra("operator"):
        from kubernetes_asyncio import client

        from servegraph.cli.rollouts import get_object
        from servegraph.operator.serve_service import WIDENING
        from servegraph.operator.spec import SpecError, owner_reference, parse_spec
    name = args.old.split("/", 1)[1]
    async with kubeconfig.cluster(args, "diff") as kube:
        custom = client.CustomObjectsApi(kube.api)
        body = await get_object(custom, GROUP, VERSION, kube.namespace, PLURAL, name)
        if body is None:
            raise Failure(f"servegraph diff: ServeGraph {kube.namespace}/{name} not found", EXIT_INVALID)
        try:
            # What would render, not what this cluster's operator allows: it enforces that itself.
            spec = parse_spec(body.get("spec") or {}, kube.namespace, serve_service_types=WIDENING)
        except SpecError as exc:
            raise Failure(f"servegraph diff: ServeGraph {kube.namespace}/{name}: {exc}") from None
        options = spec.rayservice_options(name, kube.namespace, owner_reference(body))
        rs_name = (body.get("status") or {}).get("rayServiceName") or options.name
        live = await get_object(custom, "ray.io", "v1", kube.namespace, "rayservices", rs_name)
    version = ((body.get("status") or {}).get("graph") or {}).get("version")
    return live, options, version if isinstance(version, str) else None
