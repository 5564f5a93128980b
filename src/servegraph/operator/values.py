"""The values the reconcile's stages hand each other (pure, immutable).

They sit below every stage: the download returns a `GoodGraph`, every step returns an
`Outcome` (its conditions, Events and whether to retry), the render keeps a `Desired`
RayService keyed by a `RenderKey`, the rollback store's last write is a `Stored`, and the
reconcile gathers an `Observed` for the status stage. No stage imports another to reach
these, so the stages stand in one order (tests/unit/test_layers.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from servegraph.dag.model import Graph
from servegraph.names import ConditionType
from servegraph.operator.conditions import Condition
from servegraph.operator.kuberay import MatchKey, text_digest
from servegraph.operator.packed import pack_bytes, unpack_bytes
from servegraph.render.canary import Split


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Outcome:
    """What a reconcile step found, before it becomes status and events.

    Each step (download, ownership, rollout, render, apply, suspension) returns its
    own; the reconcile chains them with `then` and stops when one says `retry`. A
    condition left None keeps its previous value (that step did not run or did not say).
    """

    fetched: Condition | None = None
    valid: Condition | None = None
    applied: Condition | None = None
    events: tuple[Event, ...] = ()
    retry: bool = False
    progressing: Condition | None = None

    def then(self, later: Outcome) -> Outcome:
        """Both steps' findings: the later step's conditions win, events add up, either may ask to retry."""
        return Outcome(
            _latest(self.fetched, later.fetched),
            _latest(self.valid, later.valid),
            _latest(self.applied, later.applied),
            self.events + later.events,
            self.retry or later.retry,
            _latest(self.progressing, later.progressing),
        )

    def conditions(self) -> tuple[Condition, ...]:
        """The conditions this outcome sets."""
        found = (self.fetched, self.valid, self.applied, self.progressing)
        return tuple(c for c in found if c is not None)


def _latest(earlier: Condition | None, later: Condition | None) -> Condition | None:
    return earlier if later is None else later


@dataclass(frozen=True)
class GoodGraph:
    """A valid graph (the last downloaded, or a kept one): what the status and the rollout
    read of it, and its bytes packed to parse again when it must be rendered.

    Not the parsed model: a typical tenant's graph (~56 nodes) is ~20 KiB parsed and ~1 KiB
    packed, so at 10,000 ServeGraphs keeping the model cost ~200 MiB for what a steady
    cluster never reads. The renderer asks `rendering.parsed`, which takes it from the
    recently parsed graphs (`WatchCache.graph`) or parses the packed bytes again."""

    digest: str
    name: str
    version: str
    applications: tuple[str, ...]
    node_count: int
    packed: bytes = field(repr=False)
    size: int = 0
    """Bytes of the graph as downloaded: whether the rollback store can keep it."""

    @classmethod
    def of(cls, graph: Graph, digest: str, data: bytes) -> GoodGraph:
        """`data` are the graph's bytes as downloaded (or kept), `graph` what they parse to."""
        names = tuple(a.name for a in graph.applications)
        return cls(digest, graph.name, graph.version, names, graph.node_count, pack_bytes(data), len(data))

    def data(self) -> bytes:
        return unpack_bytes(self.packed)


@dataclass(frozen=True)
class Observed:
    """Everything the status stage (`status.report`) reads, gathered by the reconcile."""

    outcome: Outcome
    good: GoodGraph | None
    etag: str | None
    rayservice: str | None
    """The RayService's name once one is desired; None before (no valid graph, or an invalid spec)."""
    applications: Mapping[str, Any] | None
    """Mirrored application statuses of the live RayService; None when it does not exist."""
    upgrade: Mapping[str, Any] | None = None
    """KubeRay's new-cluster upgrade in progress (kuberay.mirror_upgrade), or None."""
    pending: Mapping[str, Any] | None = None
    """The Ray cluster KubeRay is starting and its applications (kuberay.mirror_pending), or None."""
    rollout: Mapping[str, Any] | None = None
    """status.rollout as rollout.decide left it (None: no rollout yet, leave it out)."""
    history: list[dict[str, Any]] | None = None
    conflict: str | None = None
    """Why the RayService of that name is not this ServeGraph's to write (ownership.conflict), or None."""
    still_current: frozenset[str] = frozenset(
        {ConditionType.FETCHED, ConditionType.GRAPH_VALID, ConditionType.APPLIED, ConditionType.PROGRESSING}
    )
    """The conditions this reconcile did not recompute that still answer for this generation:
    the source they were computed for is the one the spec names now. The others (a new URL,
    pin or token whose download failed or has not run yet, an invalid spec) keep the
    generation they were computed for, so an old success never reads as the new spec's."""
    suspended: Condition | None = None
    """The Ready condition of a suspended ServeGraph (rollout/suspension.py): no RayService
    runs, so none is mirrored; None otherwise."""
    layout: Mapping[str, str] | None = None
    """`status.layout` once a layout was applied ({base, live} digests); None leaves it as it is."""


@dataclass(frozen=True)
class Layout:
    """What the Serve config runs (render/canary.py): the base build, the live version beside
    it (None: the base itself), a canary (None: none) with its split, and a retiring version
    whose side applications are kept while the requests in them finish."""

    base: GoodGraph
    live: GoodGraph | None = None
    canary: GoodGraph | None = None
    split: Split | None = None
    retiring: GoodGraph | None = None
    ready: bool = False
    """Rendered ready for a canary (spec.rollout.canary is set, or the base serves beside copies)."""

    @property
    def serving(self) -> GoodGraph:
        """The version that answers the requests no canary takes."""
        return self.live or self.base

    @property
    def plain(self) -> bool:
        """One version built whole: the graph's own Serve config."""
        return self.live is None and self.canary is None and self.retiring is None

    def key(self) -> str:
        """What the render depends on: every version's digest, the split, the ready form."""
        parts = [self.base.digest, *(g.digest if g else "-" for g in (self.live, self.canary, self.retiring))]
        split = self.split
        if split is not None:
            parts.append(f"{split.weight}/{split.mirror}/{split.sticky_header}/{split.sticky_field}/{split.stats}")
        return "|".join([*parts, "ready" if self.ready else "plain"])


@dataclass(frozen=True, slots=True)
class RenderKey:
    """What a desired RayService was rendered from: render again when it changes."""

    digest: str
    """The graph's, or a layout's (`Layout.key`)."""
    uid: str | None
    generation: int | None
    groups: tuple[str, ...]
    """The running cluster's worker-group names, in its order (new renders keep it); () when none runs."""
    restart: str | None
    """The restart annotation's value rendered into the pod templates (metadata: no generation moves)."""
    suspend: bool = False
    """KubeRay's own `spec.suspend` rendered (spec.suspend, where the installed KubeRay has it)."""


@dataclass
class Desired:
    """The RayService rendered from the last good graph, and what it was rendered from.

    Its Serve config text is most of the manifest and is read only to apply (when it
    changed): it is kept compressed (~1/6 of the text), and compared by its digest."""

    frame: dict[str, Any]
    """The manifest without spec.serveConfigV2."""
    serve_packed: bytes
    serve_digest: str
    render_key: RenderKey
    match_key: MatchKey
    """(spec hash, owner uid): what a live RayService is compared by."""
    size: int = 0
    """Bytes of the manifest as JSON (objectsize.manifest_bytes): over the limit it is never applied."""

    @classmethod
    def of(cls, manifest: Mapping[str, Any], render_key: RenderKey, match_key: MatchKey, size: int = 0) -> Desired:
        spec = dict(manifest["spec"])
        text = str(spec.pop("serveConfigV2", ""))
        packed = pack_bytes(text.encode())
        return cls({**manifest, "spec": spec}, packed, text_digest(text), render_key, match_key, size)

    def manifest(self) -> dict[str, Any]:
        """The whole RayService, to apply."""
        text = unpack_bytes(self.serve_packed).decode()
        return {**self.frame, "spec": {**self.frame["spec"], "serveConfigV2": text}}


@dataclass(frozen=True, slots=True)
class Stored:
    """The rollback store's ConfigMap as it was last written or read (rollout/store.py): the
    precondition of its next write, and digest → size of each graph in it (the bytes are not held)."""

    owner: str
    """The uid of the ServeGraph it was written for: a ServeGraph made again under the same
    name never writes over its predecessor's (the garbage collector's) ConfigMap unread."""
    resource_version: str
    sizes: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, owner: Mapping[str, Any], cm: Mapping[str, Any], sizes: Mapping[str, int]) -> Stored:
        return cls(str(owner.get("uid")), str(cm["metadata"]["resourceVersion"]), tuple(sorted(sizes.items())))
