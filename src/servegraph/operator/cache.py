"""What the operator knows between reconciles, in memory only.

Two kinds of state, both lost on restart and rebuilt from the watches' first
list: what the watches delivered (ServeGraph bodies, the labelled RayServices
condensed to `Live`), and what the reconcile remembers per ServeGraph (`Memory`:
when to download, the last good graph, the RayService it rendered from it, the
RayService name it claims). Keeping the watches' copies is what lets a steady
cluster cost no API reads: a reconcile triggered by a status update reads the
RayService from here.

Everything is keyed by objects that exist: a deleted ServeGraph takes its memory,
its claim and its RayService's record with it, and a deleted RayService nobody
claims leaves nothing behind, so the cache does not grow as objects come and go.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from servegraph.dag.model import Graph
from servegraph.names import Key
from servegraph.operator.kuberay import Live
from servegraph.operator.packed import pack, unpack
from servegraph.operator.parsed import ParsedGraphs
from servegraph.operator.spec import Source
from servegraph.operator.values import Desired, GoodGraph, Stored

SERVEGRAPHS = "servegraphs"
RAYSERVICES = "rayservices"


class Unseen:
    """A RayService the watch has not delivered (distinct from None: seen deleted)."""


UNSEEN = Unseen()


@dataclass(frozen=True, slots=True)
class FetchState:
    """When the next download is due and what it sends: what the last download that ended
    left (fetch/download.py returns a new one; the reconcile records it). A download that
    never ended (cancelled: a lost Lease, a stopped operator) leaves nothing, so it runs again."""

    source: Source | None = None
    """The source of the last download attempt: a different one downloads at once."""
    refresh: str | None = None
    """The refresh annotation the last download saw: a new value downloads at once."""
    retry_at: float = 0.0
    """Monotonic time after which a failed download may be tried again; 0 when none failed."""
    poll_due: float = 0.0
    """Monotonic time of the next poll (a source with a pollInterval)."""
    etag: str | None = None


@dataclass
class Memory:
    """What the reconcile remembers of one ServeGraph."""

    fetch: FetchState = field(default_factory=FetchState)
    good: GoodGraph | None = None
    """The last valid download: the candidate a rollout starts from."""
    unkept: bool = False
    """It fits the rollback store (operator/rollout/store.py) and is not in it yet: the rollout
    keeps its bytes (`good.data()`, no second copy held meanwhile)."""
    target: GoodGraph | None = None
    """The graph the rollout runs (the candidate, or a kept one: rollback, pin)."""
    stored: Stored | None = None
    """The rollback store's ConfigMap as last written: its next write needs no read first."""
    desired: Desired | None = None
    conditions: dict[str, str] = field(default_factory=dict)
    """Condition type → status as last written, for the metrics."""
    computed_for: dict[str, Source] = field(default_factory=dict)
    """Condition type → the source it was last computed for: a condition not recomputed is still
    current only while the spec names the same source (status.Observed.still_current)."""


@dataclass(frozen=True, slots=True)
class _Held:
    """A ServeGraph as the watch delivered it: its status packed (operator/packed.py), as it
    is read once per reconcile and is most of the body (~7 of ~11 KiB as dicts)."""

    head: dict[str, Any]
    """The body without its status: identity, labels, spec."""
    status: bytes | None


class WatchCache:
    def __init__(self) -> None:
        self._bodies: dict[Key, _Held] = {}
        self._memory: dict[Key, Memory] = {}
        # None: deleted (kept only while a ServeGraph claims the name). Missing: never
        # delivered, or deleted unclaimed (read once by the reconcile).
        self._rayservices: dict[Key, Live | None] = {}
        # RayService → the ServeGraph that renders it: two ServeGraphs naming one
        # RayService must not take turns writing it.
        self._claims: dict[Key, Key] = {}
        self._claimed: dict[Key, set[Key]] = {}  # the same, by ServeGraph: no scan of every claim per reconcile
        self.rayservices_complete = False
        """Whether the watch delivers every RayService (not only ours), and delivered each once
        before any ServeGraph (handlers.py: kopf's index): then one missing here is absent."""
        # Forgotten after a write found them other than recorded: read again, not taken as absent.
        self._unread: set[Key] = set()
        # The version each of the operator's last writes answered, until the watch delivers it
        # back (consumed then: a later delivery of it, a re-list, is handled as any other).
        self._echo_servegraphs: dict[Key, str] = {}
        self._echo_rayservices: dict[Key, str] = {}
        # Parsed graphs by sha256 of their bytes, with a node budget per namespace (parsed.py).
        self.parsed = ParsedGraphs()
        # spec.source.url → the ServeGraphs that name it: a "graph published" event finds
        # its ServeGraphs without reading every one (2 ms of CPU an event at 10,000).
        self._by_url: dict[str, set[Key]] = {}
        # When each record was last stored, on a counter: a re-list compares only records stored
        # before it began (`vanished`), as one stored since may be newer than what it lists.
        self._tick = 0
        self._stamps: dict[tuple[str, Key], int] = {}

    # -- ServeGraphs -----------------------------------------------------------------

    def put_servegraph(self, body: Mapping[str, Any]) -> Key:
        """Keep the body; returns its key."""
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        head = _slim(body)
        status = head.pop("status", None)
        held = self._bodies.get(key)
        self._index_url(key, None if held is None else source_url(held.head), source_url(head))
        self._bodies[key] = _Held(head, None if status is None else pack(status))
        self._stamp(SERVEGRAPHS, key)
        return key

    def _index_url(self, key: Key, old: str | None, new: str | None) -> None:
        if old == new:
            return
        if old is not None:
            keys = self._by_url[old]
            keys.discard(key)
            if not keys:
                del self._by_url[old]
        if new is not None:
            self._by_url.setdefault(new, set()).add(key)

    def put_status(
        self, key: Key, uid: str, status: Mapping[str, Any], written: Mapping[str, Any] | None = None
    ) -> None:
        """The status the operator just wrote, kept until the watch delivers the object with
        it. The cached body is replaced, never edited: a reconcile may be holding it.

        `written`, the object as the write answered: when nothing but its status and version
        differ from the body held, it is held as that version, and the watch's next delivery
        of that version (`echo_servegraph`) is its own write coming back. Anything else changed
        meanwhile, the body held keeps its version and that delivery is reconciled."""
        held = self._bodies.get(key)
        if held is None or held.head["metadata"].get("uid") != uid:
            return
        head = held.head
        if written is not None:
            new = _slim(written)
            new.pop("status", None)
            version = (new.get("metadata") or {}).get("resourceVersion")
            if version is not None and _unversioned(new) == _unversioned(head):
                if head["metadata"].get("resourceVersion") != version:  # else delivered already
                    self._echo_servegraphs[key] = str(version)
                head = new
        self._bodies[key] = _Held(head, pack(status))
        self._stamp(SERVEGRAPHS, key)

    def echo_servegraph(self, key: Key, resource_version: str | None) -> bool:
        """Whether this delivery is the operator's own status write coming back, that version
        held already (then it changes nothing). Asked once per delivery: it consumes the mark."""
        return resource_version is not None and self._echo_servegraphs.pop(key, None) == resource_version

    def forget_servegraph(self, key: Key) -> None:
        held = self._bodies.pop(key, None)
        if held is not None:
            self._index_url(key, source_url(held.head), None)
        self._stamps.pop((SERVEGRAPHS, key), None)
        self._echo_servegraphs.pop(key, None)
        self._memory.pop(key, None)
        for rayservice in self._claimed.pop(key, ()):
            del self._claims[rayservice]
            self._unread.discard(rayservice)
            if self._rayservices.get(rayservice, UNSEEN) is None:
                del self._rayservices[rayservice]
                self._stamps.pop((RAYSERVICES, rayservice), None)

    def body(self, key: Key) -> dict[str, Any] | None:
        """The whole body, its status unpacked: a new dict each time (the reconcile's own)."""
        held = self._bodies.get(key)
        if held is None:
            return None
        return held.head if held.status is None else {**held.head, "status": unpack(held.status)}

    def head(self, key: Key) -> dict[str, Any] | None:
        """The body without its status: cheap, for what needs only identity, labels or spec."""
        held = self._bodies.get(key)
        return None if held is None else held.head

    def heads(self, url: str | None = None) -> list[dict[str, Any]]:
        """Every ServeGraph's head, or (`url`) those whose spec.source.url is that URL."""
        if url is None:
            return [held.head for held in self._bodies.values()]
        return [self._bodies[key].head for key in sorted(self._by_url.get(url, ()))]

    def servegraph_keys(self) -> list[Key]:
        return list(self._bodies)

    def memory(self, key: Key) -> Memory:
        """The reconcile's memory of a ServeGraph, empty the first time."""
        return self._memory.setdefault(key, Memory())

    def forget_memories(self) -> None:
        """Drop every reconcile's memory and the marks of the operator's own writes, keeping what
        the watches delivered: a replica that stops leading may lead again after another did, and
        what it remembers (the last download, the render, the store as written) is then older
        than what the other applied. Acting on it rolled 20 ServeGraphs back a version (issue 44)."""
        self._memory.clear()
        self._echo_servegraphs.clear()
        self._echo_rayservices.clear()
        # A record compared with a render forgotten now says nothing of the next one: read it
        # again on first use (a GET per RayService, once per leadership regained), or a change
        # the other leader applied would be applied a second time.
        for rayservice, live in list(self._rayservices.items()):
            if live is not None and live.compared and live.raw is None:
                self.forget_rayservice(rayservice)

    def peek_memory(self, key: Key) -> Memory | None:
        return self._memory.get(key)

    def condition_pairs(self) -> Iterator[tuple[str, str]]:
        for memory in list(self._memory.values()):
            yield from memory.conditions.items()

    # -- RayServices --------------------------------------------------------------------

    def put_rayservice(self, rayservice: Key, live: Live | None) -> None:
        """What a reconcile needs of a RayService; None once it is deleted (if claimed)."""
        self._unread.discard(rayservice)
        if live is None:
            self._echo_rayservices.pop(rayservice, None)
        if live is None and rayservice not in self._claims:
            self._rayservices.pop(rayservice, None)
            self._stamps.pop((RAYSERVICES, rayservice), None)
        else:
            self._rayservices[rayservice] = live
            self._stamp(RAYSERVICES, rayservice)

    def put_applied(self, rayservice: Key, live: Live) -> None:
        """The record the operator's apply answered: the watch's next delivery of that version
        (`echo_rayservice`) is the apply coming back, unless that version is held already (an
        apply that changed nothing, or the watch was first): then no delivery of it is expected."""
        held = self._rayservices.get(rayservice)
        version = live.resource_version
        if version is not None and not (isinstance(held, Live) and held.resource_version == version):
            self._echo_rayservices[rayservice] = version
        self.put_rayservice(rayservice, live)

    def echo_rayservice(self, rayservice: Key, resource_version: str | None) -> bool:
        """Whether this delivery is the operator's own apply coming back, its record held (then
        it changes nothing). Asked once per delivery: it consumes the mark."""
        expected = self._echo_rayservices.pop(rayservice, None)
        live = self._rayservices.get(rayservice)
        return (
            resource_version is not None
            and expected == resource_version
            and isinstance(live, Live)
            and live.resource_version == resource_version
        )

    def rayservice(self, rayservice: Key) -> Live | Unseen | None:
        return self._rayservices.get(rayservice, UNSEEN)

    def forget_rayservice(self, rayservice: Key) -> None:
        """Read it again next time (an apply found it other than the cache said)."""
        self._rayservices.pop(rayservice, None)
        self._stamps.pop((RAYSERVICES, rayservice), None)
        self._echo_rayservices.pop(rayservice, None)
        self._unread.add(rayservice)

    def absent(self, rayservice: Key) -> bool:
        """Whether a RayService the watch never delivered is known not to exist (no read needed)."""
        return self.rayservices_complete and rayservice not in self._unread and rayservice not in self._rayservices

    def claim(self, rayservice: Key, key: Key) -> Key | None:
        """Claim a RayService name for a ServeGraph; returns the other ServeGraph that holds it, if one does."""
        holder = self._claims.get(rayservice)
        if holder is not None and holder != key and holder in self._bodies:
            return holder
        mine = self._claimed.setdefault(key, set())
        for other in [rs for rs in mine if rs != rayservice]:
            mine.discard(other)
            del self._claims[other]  # the ServeGraph now renders another name
        if holder is not None and holder != key:  # its ServeGraph is gone
            self._claimed.get(holder, set()).discard(rayservice)
        self._claims[rayservice] = key
        mine.add(rayservice)
        return None

    # -- re-lists ---------------------------------------------------------------------------

    def _stamp(self, kind: str, key: Key) -> None:
        self._tick += 1
        self._stamps[(kind, key)] = self._tick

    def listing(self) -> int:
        """A watch's list begins: what `vanished` later compares against."""
        return self._tick

    def vanished(self, kind: str, namespace: str | None, listed: Collection[Key], since: int) -> list[Key]:
        """The objects of `kind` (SERVEGRAPHS or RAYSERVICES) held as existing, in `namespace`
        (None: every one), that a list begun at `since` did not return: deleted while no
        watch delivered it (a watch gap ended by 410 Gone delivers no DELETED). A record
        stored since the list began is left out: it may be newer than the list."""
        held: Iterable[Key] = self._bodies if kind == SERVEGRAPHS else self._rayservices
        gone = set(held) - set(listed)
        return sorted(
            key
            for key in gone
            if (namespace is None or key[0] == namespace)
            and self._stamps.get((kind, key), since + 1) <= since
            and (kind == SERVEGRAPHS or self._rayservices.get(key) is not None)
        )

    def claimant(self, rayservice: Key) -> Key | None:
        """The ServeGraph that claims (renders) this RayService name, if one does."""
        return self._claims.get(rayservice)

    def sizes(self) -> dict[str, int]:
        """How many entries each per-object table holds: what must not grow as objects come and go."""
        return {
            "servegraphs": len(self._bodies),
            "memory": len(self._memory),
            "rayservices": len(self._rayservices),
            "claims": len(self._claims),
            "urls": len(self._by_url),
            "stamps": len(self._stamps),
        }

    # -- graphs ---------------------------------------------------------------------------

    def graph(self, digest: str) -> Graph | None:
        """The graph of those bytes, if it was parsed recently."""
        return self.parsed.get(digest)

    def share_graph(self, digest: str, graph: Graph, tenant: str) -> None:
        """Keep a parsed graph for the next render, charged to the namespace `tenant`."""
        self.parsed.put(digest, graph, tenant)


def source_url(head: Mapping[str, Any]) -> str | None:
    """A ServeGraph's spec.source.url as watched (unvalidated): what the URL index and events match by."""
    url = ((head.get("spec") or {}).get("source") or {}).get("url")
    return url if isinstance(url, str) else None


def _unversioned(head: Mapping[str, Any]) -> dict[str, Any]:
    meta = head.get("metadata") or {}
    return {**head, "metadata": {k: v for k, v in meta.items() if k != "resourceVersion"}}


def _slim(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A watched object without metadata.managedFields, which mirrors the whole spec
    and is never read here: a third of the memory per ServeGraph at scale."""
    out = dict(obj)
    meta = out.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        out["metadata"] = {k: v for k, v in meta.items() if k != "managedFields"}
    return out
