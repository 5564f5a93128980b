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
costs, so it renders on the event loop; a big one (a 10,000-node graph takes a tenth of a
second) in a thread, so that the loop keeps serving the other ServeGraphs meanwhile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from servegraph.dag.model import Graph
from servegraph.graph import GraphError, parse_graph
from servegraph.names import SPEC_HASH_ANNOTATION, ConditionType
from servegraph.operator.apply.drift import Desired
from servegraph.operator.apply.objectsize import manifest_bytes
from servegraph.operator.cache import WatchCache
from servegraph.operator.protocols import Parser
from servegraph.operator.spec import ServeGraphSpec, owner_reference
from servegraph.operator.status.conditions import Condition
from servegraph.operator.status.report import GoodGraph, Outcome
from servegraph.render import RayServiceOptions, render_rayservice

INLINE_NODES = 500
"""Graphs up to this many nodes (a few ms of CPU) render on the event loop; bigger ones in a thread."""

GROUPS = 3
"""Where the running cluster's worker-group names are in a render key."""


async def desired(
    kept: Desired | None,
    good: GoodGraph,
    spec: ServeGraphSpec,
    body: Mapping[str, Any],
    previous: Mapping[str, Any] | None,
    graphs: WatchCache,
    parser: Parser,
    restart: str | None = None,
) -> Desired | Outcome:
    """The RayService to apply for `good`: `kept` (the one rendered last) while nothing it is
    rendered from changed; or an Outcome saying why not when the graph does not fit the pods
    the spec asks for. `previous` is the running RayService's rayClusterConfig, if any.
    The reconcile remembers what it returns."""
    meta = body["metadata"]
    groups = tuple(g.get("groupName") for g in (previous or {}).get("workerGroupSpecs") or ())
    # The restart annotation is metadata: changing it moves no generation.
    render_key = (good.digest, meta.get("uid"), meta.get("generation"), groups, restart)
    if kept is not None and kept.render_key != render_key and same_render(kept, render_key):
        kept = replace(kept, render_key=render_key)
    if kept is None or kept.render_key != render_key:
        options = replace(
            spec.rayservice_options(meta["name"], meta["namespace"], owner_reference(body)),
            previous_cluster=previous,
            restarted_at=restart,
        )
        try:
            manifest, size = await _render(await parsed(good, graphs, parser), options)
        except GraphError as exc:
            # The graph is valid, but not in the pods this spec asks for (a replica bigger
            # than the overridden worker): the spec must change, so no retry; what runs stays.
            return Outcome(applied=Condition(ConditionType.APPLIED, False, "PodsTooSmall", str(exc)))
        match_key = (manifest["metadata"]["annotations"][SPEC_HASH_ANNOTATION], meta.get("uid"))
        kept = Desired.of(manifest, render_key, match_key, size)
    return kept


async def parsed(good: GoodGraph, graphs: WatchCache, parser: Parser) -> Graph:
    """The graph to render: from the recently parsed ones, else parsed again from its packed
    bytes — here when they are small (they were validated when downloaded: a typical tenant's
    graph parses in about a millisecond, less than the trip to a parse child costs), in a
    parse child like a download when they are not."""
    graph = graphs.graph(good.digest)
    if graph is None:
        data = good.data()
        if len(data) <= INLINE_PARSE_BYTES:
            graph = parse_graph(data, max_bytes=len(data))
        else:
            graph = await parser(data, len(data))
        graphs.share_graph(good.digest, graph)
    return graph


INLINE_PARSE_BYTES = 32 * 1024
"""Validated graphs up to this size (~300 nodes, ~5 ms) are parsed again on the event loop."""


def same_render(kept: Desired, render_key: tuple[Any, ...]) -> bool:
    """Whether rendering for `render_key` would give `kept`'s manifest again: `kept` was rendered
    with no running cluster, everything else is the same, and the running cluster's worker groups
    are `kept`'s own, in its order (the cluster it created)."""
    old = kept.render_key
    if old[GROUPS] != () or old[:GROUPS] != render_key[:GROUPS] or old[GROUPS + 1 :] != render_key[GROUPS + 1 :]:
        return False
    cluster = kept.frame["spec"]["rayClusterConfig"]
    own: tuple[Any, ...] = tuple(g.get("groupName") for g in cluster.get("workerGroupSpecs") or ())
    return bool(render_key[GROUPS] == own)


async def _render(graph: Graph, options: RayServiceOptions) -> tuple[dict[str, Any], int]:
    if graph.node_count <= INLINE_NODES:
        return _sized(graph, options)
    return await asyncio.to_thread(_sized, graph, options)


def _sized(graph: Graph, options: RayServiceOptions) -> tuple[dict[str, Any], int]:
    """The manifest and its size as JSON (`objectsize.manifest_bytes`)."""
    manifest = render_rayservice(graph, options)
    return manifest, manifest_bytes(manifest)
