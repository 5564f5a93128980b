"""The fetch step of a reconcile: credentials, limits, the download and the parse.

Every way it can fail ends in a `Fetched` (or `GraphValid`) condition that names
it and a retry with backoff: a bad port, a broken CA bundle, a Secret that cannot
be read, an error nobody foresaw. None of them may leave the ServeGraph looking
downloaded and never try again.

A download returns what it learned (`Downloaded`) and writes nothing: the reconcile
records it once it has it. A download cancelled half way (the Lease lost, the operator
stopped, a Secret read hanging in an API outage) so leaves the ServeGraph due for one,
and whoever reconciles it next downloads again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from servegraph.graph import GraphError
from servegraph.kube import KubeError
from servegraph.names import ConditionType, Key
from servegraph.operator.cache import FetchState, Memory, WatchCache
from servegraph.operator.conditions import Condition
from servegraph.operator.protocols import ConfigMapKeys, Fetcher, Parser
from servegraph.operator.secrets import SecretCache, SecretError
from servegraph.operator.spec import Source
from servegraph.operator.values import Event, GoodGraph, Outcome
from servegraph.source import Fetched, FetchError, FetchRequest, Limits

log = logging.getLogger("servegraph.operator")

MAX_PROBLEMS_SHOWN = 20


def needs_fetch(memory: Memory, source: Source, refresh: str | None, now: float) -> bool:
    """New inputs fetch at once; a failure waits for its retry; otherwise only a poll fetches."""
    state = memory.fetch
    if state.source != source or state.refresh != refresh:
        return True
    if state.retry_at:
        return now >= state.retry_at
    return source.poll_interval_s is not None and now >= state.poll_due


@dataclass(frozen=True)
class Downloaded:
    """What one download learned, for the reconcile to record: the fetch state it leaves, the
    new valid graph (None: no new one), and what the conditions say."""

    state: FetchState
    outcome: Outcome
    good: GoodGraph | None = None

    def record(self, memory: Memory) -> None:
        """Into the reconcile's memory: only the reconcile calls this, once it has the result."""
        memory.fetch = self.state
        if self.good is not None:
            memory.good = self.good


class Downloader:
    def __init__(
        self,
        fetcher: Fetcher,
        parser: Parser,
        secrets: SecretCache,
        configmaps: ConfigMapKeys,
        limits: Limits,
        cache: WatchCache,
        min_retry_delay_s: float,
        unexpected: Callable[[Exception], None] = lambda exc: None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.fetcher = fetcher
        self.parser = parser
        self.secrets = secrets
        self.configmaps = configmaps
        self.limits = limits
        self.cache = cache
        self.min_retry_delay_s = min_retry_delay_s
        self.unexpected = unexpected
        """Told of each failure nobody foresaw (the reconciler counts it in a metric)."""
        self.monotonic = monotonic
        """Seconds for polls and retries, never going back (a test moves its own)."""

    async def run(self, key: Key, memory: Memory, source: Source, refresh: str | None) -> Downloaded:
        """Download and parse: what it found for the Fetched and GraphValid conditions, and
        the fetch state and graph to record. Reads `memory`, never writes it."""
        old = memory.fetch
        etag = old.etag if old.source == source and memory.good is not None else None
        poll_due = self.monotonic() + source.poll_interval_s if source.poll_interval_s else old.poll_due
        state = FetchState(source=source, refresh=refresh, poll_due=poll_due, etag=old.etag)
        try:
            got = await self._download(source, etag)
        except Exception as exc:
            failed = _failure(key, exc)
            if failed.reason == "InternalError":
                self.unexpected(exc)
            # Retried on the queue's backoff; events arriving before its earliest retry do
            # not fetch. Counted from the failure (a download with retries outlasts that),
            # and never past the retry: a retry that skipped the fetch would be the last.
            retry_at = self.monotonic() + self.min_retry_delay_s
            return Downloaded(replace(state, retry_at=retry_at), Outcome(fetched=failed, retry=True))
        if got.not_modified:
            fetched = Condition(
                ConditionType.FETCHED, True, "NotModified", f"{got.url} has not changed (ETag {got.etag})"
            )
            return Downloaded(state, Outcome(fetched=fetched))
        if source.sha256 and got.digest != source.sha256:
            # Neither the digest nor the size of what answered: with both, the status would
            # let a tenant brute-force a small secret an internal endpoint returns.
            mismatch = Condition(
                ConditionType.FETCHED,
                False,
                "DigestMismatch",
                f"{got.url} served content that does not match the pinned sha256 {source.sha256}",
            )
            return Downloaded(replace(state, etag=None), Outcome(fetched=mismatch))
        try:
            graph = self.cache.graph(got.digest) or await self.parser(got.body, self._max_bytes(source))
        except GraphError as exc:  # not a graph: its size stays unsaid, as its digest
            invalid = Outcome(
                fetched=Condition(ConditionType.FETCHED, True, "Downloaded", f"downloaded from {got.url}"),
                valid=Condition(ConditionType.GRAPH_VALID, False, "InvalidGraph", _problems(exc)),
            )
            return Downloaded(replace(state, etag=None), invalid)  # revalidate the next download in full
        events: tuple[Event, ...] = ()
        if memory.good is None or got.digest != memory.good.digest:
            events = (
                Event("Normal", "Fetched", f"graph {graph.name} version {graph.version!r} sha256 {got.digest[:12]}"),
            )
        self.cache.share_graph(got.digest, graph, key[0])
        apps, nodes = len(graph.applications), graph.node_count
        summary = f"{apps} application{'s' * (apps != 1)}, {nodes} node{'s' * (nodes != 1)}"
        outcome = Outcome(
            fetched=Condition(
                ConditionType.FETCHED, True, "Downloaded", f"downloaded {len(got.body)} bytes from {got.url}"
            ),
            valid=Condition(
                ConditionType.GRAPH_VALID, True, "Valid", f"graph {graph.name} version {graph.version!r}: {summary}"
            ),
            events=events,
        )
        return Downloaded(replace(state, etag=got.etag), outcome, GoodGraph.of(graph, got.digest, got.body))

    def _max_bytes(self, source: Source) -> int:
        return self.limits.clamp(source.timeout_s, source.max_bytes)[1]

    async def _download(self, source: Source, etag: str | None) -> Fetched:
        token, fresh = await self.secrets.value(source.token)
        request = await self._request(source, token, etag)
        try:
            return await self.fetcher(request)
        except FetchError as exc:
            if exc.status not in (401, 403) or fresh:
                raise
        # The registry refused a token read a while ago: it may have been rotated since.
        self.secrets.invalidate(*source.token.secret)
        token, _ = await self.secrets.value(source.token)
        return await self.fetcher(await self._request(source, token, etag))

    async def _request(self, source: Source, token: str, etag: str | None) -> FetchRequest:
        timeout_s, max_bytes = self.limits.clamp(source.timeout_s, source.max_bytes)
        return FetchRequest(
            url=source.url,
            token=token,
            etag=etag,
            timeout_s=timeout_s,
            max_bytes=max_bytes,
            ca_pem=await self._ca(source),
            allow_insecure_http=source.allow_insecure_http,
            min_bytes_per_s=self.limits.min_bytes_per_s,
            rate_grace_s=self.limits.rate_grace_s,
        )

    async def _ca(self, source: Source) -> str | None:
        if source.ca_secret is not None:
            return (await self.secrets.value(source.ca_secret))[0]
        if source.ca_config_map is not None:
            ref = source.ca_config_map
            try:
                return await self.configmaps.read_configmap_key(ref.namespace, ref.name, ref.key)
            except KubeError as exc:
                raise SecretError(f"CABundle{exc.reason}", str(exc)) from None
        return None


def _failure(key: Key, exc: Exception) -> Condition:
    """The Fetched condition for any failure; the unexpected ones are logged for the administrator."""
    if isinstance(exc, FetchError):
        if exc.detail != str(exc):
            log.info("[%s/%s] download failed: %s", *key, exc.detail)
        return Condition(ConditionType.FETCHED, False, exc.reason, str(exc))
    if isinstance(exc, SecretError):
        reason = exc.reason if exc.reason.startswith("CABundle") else f"Secret{exc.reason}"
        return Condition(ConditionType.FETCHED, False, reason, str(exc))
    if isinstance(exc, KubeError):
        return Condition(ConditionType.FETCHED, False, f"Secret{exc.reason}", str(exc))
    log.error("[%s/%s] unexpected %s while downloading", *key, type(exc).__name__, exc_info=exc)
    return Condition(
        ConditionType.FETCHED,
        False,
        "InternalError",
        f"unexpected {type(exc).__name__} while downloading; the operator's log has the details",
    )


def _problems(exc: GraphError) -> str:
    lines = [str(p) for p in exc.problems]
    if len(lines) > MAX_PROBLEMS_SHOWN:
        lines = [*lines[:MAX_PROBLEMS_SHOWN], f"... and {len(lines) - MAX_PROBLEMS_SHOWN} more"]
    return "; ".join(lines)
