"""The render step of a reconcile: the desired RayService, rendered only when its inputs change.

Status updates and KubeRay's writes trigger many reconciles that change nothing the
render reads, so the rendered RayService is kept in the ServeGraph's `Memory` with the
key of what it was rendered from, and rendered again only when that key changes.

The running cluster is one of the inputs (new renders keep its worker-group order), and
the first render of a ServeGraph has none: the cluster it creates has exactly the render's
own groups, in its order. Rendering again against that cluster gives the same manifest
(`upgrade.stable_worker_groups` keeps that order, and parks no group), so the render is
kept and only its key moves: a new ServeGraph renders once, not once more when the watch
delivers the RayService it created.

A typical graph renders in about a millisecond, less than handing it to a thread and back
costs, so it renders on the event loop; one over `INLINE_NODES` (a 10,000-node graph takes a
tenth of a second) in a thread, so that the loop keeps serving the other ServeGraphs meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from servegraph.dag.model import Graph
from servegraph.graph import GraphError
from servegraph.names import SPEC_HASH_ANNOTATION, ConditionType
from servegraph.operator.apply import layouts
from servegraph.operator.apply.objectsize import manifest_bytes
from servegraph.operator.cache import WatchCache
from servegraph.operator.conditions import Condition
from servegraph.operator.protocols import Parser
from servegraph.operator.spec import ServeGraphSpec, owner_reference
from servegraph.operator.values import Desired, GoodGraph, Layout, Outcome, RenderKey
from servegraph.render import RayServiceOptions, render_rayservice

INLINE_NODES = 200
"""Graphs up to this many nodes render on the event loop (1.4 ms median, 7 ms at worst measured on
a loaded 2-core machine); bigger ones in a thread. 500 was 10 ms median, 42 ms at worst (issue 45:
no tenant input may stall the loop over 10 ms)."""


async def desired(
    kept: Desired | None,
    target: GoodGraph | Layout,
    spec: ServeGraphSpec,
    body: Mapping[str, Any],
    previous: Mapping[str, Any] | None,
    graphs: WatchCache,
    parser: Parser,
    restart: str | None = None,
    suspend: bool = False,
) -> Desired | Outcome:
    """The RayService to apply for `target` (a graph, or a layout of several versions: the base
    build, the live version beside it, a canary): `kept` (the one rendered last) while nothing
    it is rendered from changed; or an Outcome saying why not when the graph does not fit the
    pods the spec asks for. `previous` is the running RayService's rayClusterConfig, if any.
    The reconcile remembers what it returns. `suspend`: KubeRay's own spec.suspend is rendered."""
    meta = body["metadata"]
    layout = target if isinstance(target, Layout) else Layout(target)
    groups = tuple(str(g.get("groupName")) for g in (previous or {}).get("workerGroupSpecs") or ())
    what = layout.base.digest if layout.plain and not layout.ready else layout.key()
    render_key = RenderKey(what, meta.get("uid"), meta.get("generation"), groups, restart, suspend)
    if kept is not None and kept.render_key != render_key and same_render(kept, render_key):
        kept = replace(kept, render_key=render_key)
    if kept is None or kept.render_key != render_key:
        options = replace(
            spec.rayservice_options(meta["name"], meta["namespace"], owner_reference(body)),
            previous_cluster=previous,
            restarted_at=restart,
            suspend=suspend,
        )
        try:
            manifest, size = await _render_layout(layout, options, graphs, parser, meta["namespace"])
        except GraphError as exc:
            # The graph is valid, but not in the pods this spec asks for (a replica bigger
            # than the overridden worker): the spec must change, so no retry; what runs stays.
            return Outcome(applied=Condition(ConditionType.APPLIED, False, "PodsTooSmall", str(exc)))
        match_key = (manifest["metadata"]["annotations"][SPEC_HASH_ANNOTATION], meta.get("uid"))
        kept = Desired.of(manifest, render_key, match_key, size)
    return kept


async def parsed(good: GoodGraph, graphs: WatchCache, parser: Parser, tenant: str) -> Graph:
    """The graph to render: from the recently parsed ones, else parsed again from its packed
    bytes by the parser, as a download is: on the event loop only within its inline limits
    (16 KiB and 200 nodes: a few ms at most), in a parse child otherwise. Re-parsing every
    graph up to 32 KiB here held the loop 24 ms (127 ms at worst) for a valid 1,429-node
    graph of 32,760 bytes (issue 45)."""
    graph = graphs.graph(good.digest)
    if graph is None:
        data = good.data()
        graph = await parser(data, len(data))
        graphs.share_graph(good.digest, graph, tenant)
    return graph


def same_render(kept: Desired, render_key: RenderKey) -> bool:
    """Whether rendering for `render_key` would give `kept`'s manifest again: `kept` was rendered
    with no running cluster, everything else is the same, and the running cluster's worker groups
    are `kept`'s own, in its order (the cluster it created)."""
    old = kept.render_key
    if old.groups != () or replace(old, groups=render_key.groups) != render_key:
        return False
    cluster = kept.frame["spec"]["rayClusterConfig"]
    own = tuple(str(g.get("groupName")) for g in cluster.get("workerGroupSpecs") or ())
    return render_key.groups == own


async def _render_layout(
    layout: Layout, options: RayServiceOptions, graphs: WatchCache, parser: Parser, tenant: str
) -> tuple[dict[str, Any], int]:
    """One version built whole (its own Serve config, written ready for a canary when the spec
    has one), or several laid out (apply/layouts.py) for a cluster that holds them all."""
    base = await parsed(layout.base, graphs, parser, tenant)
    if layout.plain:
        return await _render(base, replace(options, canary_ready=layout.ready))
    live, canary, retiring = [
        None if g is None else await parsed(g, graphs, parser, tenant)
        for g in (layout.live, layout.canary, layout.retiring)
    ]
    config = layouts.laid_out(base, live, canary, layout.split, retiring)
    cluster = layouts.footprint(base, live, canary, config)
    return await _render(cluster, replace(options, serve_config=layouts.serve_text(config)))


async def _render(graph: Graph, options: RayServiceOptions) -> tuple[dict[str, Any], int]:
    if graph.node_count <= INLINE_NODES:
        return _sized(graph, options)
    return await asyncio.to_thread(_sized, graph, options)


def _sized(graph: Graph, options: RayServiceOptions) -> tuple[dict[str, Any], int]:
    """The manifest and its size as JSON (`objectsize.manifest_bytes`)."""
    manifest = render_rayservice(graph, options)
    return manifest, manifest_bytes(manifest)
