"""The recently parsed graphs, by the digest of their bytes, with a budget per namespace.

A ServeGraph keeps its graph packed (`GoodGraph`); one rendered again soon (a publish, then
KubeRay's new cluster; a spec patch) is not parsed again while its model is here. The model
is immutable, so ServeGraphs that download the same bytes share it.

Bounded by nodes (~650 bytes each parsed): `TOTAL_NODES` in all, and `NAMESPACE_NODES`
charged to one namespace (the one whose ServeGraph stored the graph first). One shared LRU let
a tenant's large graphs evict everyone's, each eviction a parse again for its owner (issue
45): now a namespace over its budget evicts its own least recent graphs, and when the total
is full the namespace holding the most goes first.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from servegraph.dag.model import Graph

TOTAL_NODES = 50_000
"""Nodes of parsed graphs kept in all (~30 MiB)."""
NAMESPACE_NODES = 10_000
"""Nodes one namespace's graphs may hold of it."""


@dataclass(frozen=True, slots=True)
class _Kept:
    graph: Graph
    tenant: str


class ParsedGraphs:
    def __init__(self, total_nodes: int = TOTAL_NODES, namespace_nodes: int = NAMESPACE_NODES) -> None:
        self.total_nodes = total_nodes
        self.namespace_nodes = namespace_nodes
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        """By digest, least recently used first."""
        self._by_tenant: dict[str, OrderedDict[str, None]] = {}
        """Each namespace's digests, least recently used first."""
        self._nodes: dict[str, int] = {}
        self._total = 0

    def get(self, digest: str) -> Graph | None:
        kept = self._kept.get(digest)
        if kept is None:
            return None
        self._kept.move_to_end(digest)
        self._by_tenant[kept.tenant].move_to_end(digest)
        return kept.graph

    def put(self, digest: str, graph: Graph, tenant: str) -> None:
        """Keep `graph`, charged to `tenant` unless another namespace stored it first."""
        if self.get(digest) is not None:
            return
        self._kept[digest] = _Kept(graph, tenant)
        self._by_tenant.setdefault(tenant, OrderedDict())[digest] = None
        self._nodes[tenant] = self._nodes.get(tenant, 0) + graph.node_count
        self._total += graph.node_count
        while self._nodes[tenant] > self.namespace_nodes and len(self._by_tenant[tenant]) > 1:
            self._evict(tenant)
        while self._total > self.total_nodes and len(self._kept) > 1:
            self._evict(self._largest())

    def _largest(self) -> str:
        """The namespace holding the most nodes; of several, the one with the least recently used graph."""
        most = max(self._nodes.values())
        return next(kept.tenant for kept in self._kept.values() if self._nodes[kept.tenant] == most)

    def _evict(self, tenant: str) -> None:
        digests = self._by_tenant[tenant]
        digest, _ = digests.popitem(last=False)
        kept = self._kept.pop(digest)
        self._nodes[tenant] -= kept.graph.node_count
        self._total -= kept.graph.node_count
        if not digests:
            del self._by_tenant[tenant], self._nodes[tenant]

    def nodes(self, tenant: str | None = None) -> int:
        """Nodes kept, of one namespace's or in all."""
        return self._total if tenant is None else self._nodes.get(tenant, 0)

    def __len__(self) -> int:
        return len(self._kept)
