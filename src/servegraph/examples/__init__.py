"""Tiny deterministic deployments the sample graphs use, shipped so they serve out of the box.

Plain classes: servegraph's builder turns them into Serve deployments named
after their nodes. Each accepts what a router passes (a payload) and, where a
sample makes it the ingress, the HTTP request itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
from collections import Counter
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from starlette.requests import Request

from servegraph.runtime.payload import normalize_headers, payload_from_body

__all__ = [
    "Echo",
    "Embedder",
    "Guard",
    "MajorityVote",
    "Sentiment",
    "Slow",
    "StreamFilter",
    "TokenGenerator",
    "Tokenizer",
    "text_of",
]

_WORD = re.compile(r"[\w']+")
POSITIVE = ("good", "great", "love", "excellent", "happy", "nice", "wonderful", "best")
NEGATIVE = ("bad", "terrible", "hate", "awful", "sad", "poor", "worst", "boring")


async def text_of(item: Any) -> str:
    """The text of an HTTP request, a `{"text": ...}` payload or a string."""
    if isinstance(item, Request):
        item = payload_from_body(await item.body())
    if isinstance(item, Mapping):
        item = item.get("text")
    if not isinstance(item, str):
        raise ValueError(f'expected a string or {{"text": <string>}}, got {type(item).__name__}')
    return item


class Tokenizer:
    """Splits text into words."""

    def __init__(self, lowercase: bool = True) -> None:
        self.lowercase = lowercase

    async def __call__(self, item: Any) -> list[str]:
        text = await text_of(item)
        return _WORD.findall(text.lower() if self.lowercase else text)


class Sentiment:
    """Word-list polarity in [-1, 1] over the tokenizer's words; `threshold` tunes the labels live."""

    def __init__(
        self,
        tokenizer: Any,
        positive: list[str] | None = None,
        negative: list[str] | None = None,
    ) -> None:
        self.tokenizer = tokenizer  # the tokenizer node's DeploymentHandle
        self.positive = frozenset(w.lower() for w in (positive or POSITIVE))
        self.negative = frozenset(w.lower() for w in (negative or NEGATIVE))
        self.threshold = 0.0

    def reconfigure(self, user_config: Mapping[str, Any]) -> None:
        """Serve calls this with the node's `user_config`, at start and on every change."""
        self.threshold = float(user_config.get("threshold", 0.0))

    async def __call__(self, item: Any) -> dict[str, Any]:
        words: list[str] = await self.tokenizer.remote(await text_of(item))
        pos = sum(w.lower() in self.positive for w in words)
        neg = sum(w.lower() in self.negative for w in words)
        score = (pos - neg) / (pos + neg) if pos + neg else 0.0
        if score > self.threshold:
            label = "positive"
        elif score < -self.threshold:
            label = "negative"
        else:
            label = "neutral"
        return {"label": label, "score": round(score, 4)}


class Embedder:
    """A hashed bag-of-words vector, L2-normalized: deterministic across processes, no GPU.

    Uses the tokenizer node's handle when bound to one, else splits words itself.
    """

    def __init__(self, tokenizer: Any = None, dimensions: int = 8) -> None:
        if isinstance(dimensions, bool) or dimensions != int(dimensions) or dimensions < 1:
            raise ValueError(f"dimensions must be a positive integer, got {dimensions!r}")
        self.tokenizer = tokenizer
        self.dimensions = int(dimensions)

    async def __call__(self, item: Any) -> dict[str, list[float]]:
        text = await text_of(item)
        words: list[str] = await self.tokenizer.remote(text) if self.tokenizer is not None else _WORD.findall(text)
        vector = [0.0] * self.dimensions
        for word in words:
            digest = hashlib.blake2b(word.lower().encode(), digest_size=8).digest()
            bucket = int.from_bytes(digest[:4], "big") % self.dimensions
            vector[bucket] += 1.0 if digest[4] % 2 else -1.0
        norm = math.sqrt(sum(v * v for v in vector)) or 1.0
        return {"embedding": [round(v / norm, 6) for v in vector]}


class MajorityVote:
    """Ensemble combiner: the most common label among the members' outputs.

    A member's output counts if it is a label string or a dict with a "label";
    ties go to the alphabetically first label, so the result is deterministic.
    """

    def __call__(self, results: Mapping[str, Any]) -> dict[str, Any]:
        votes: Counter[str] = Counter()
        for output in results.values():
            label = output.get("label") if isinstance(output, Mapping) else output
            if isinstance(label, str):
                votes[label] += 1
        winner = min(votes, key=lambda label: (-votes[label], label)) if votes else None
        return {"label": winner, "votes": dict(sorted(votes.items()))}


class Echo:
    """Answers with what reached it: its tag, the payload and the headers routers forwarded.

    Its `__call__` declares `headers`, so routers pass it the W3C trace context and the
    application's `telemetry.forward_headers`: put last in a sequence, it shows what
    arrives at the end of a graph.
    """

    def __init__(self, tag: str = "echo") -> None:
        self.tag = tag

    async def __call__(self, item: Any, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        if isinstance(item, Request):  # at the ingress: the request's own headers
            headers = normalize_headers(item.headers.items())
            item = payload_from_body(await item.body())
        return {"node": self.tag, "payload": item, "headers": dict(headers or {})}


class Slow(Echo):
    """Echo after a delay: a branch for an edge's `timeout_s` to cut.

    Waits `delay_s`, or the payload's own `delay_s` when it is a JSON object with one
    (so one graph can show both a fast answer and a timeout).
    """

    def __init__(self, delay_s: float = 3.0, tag: str = "slow") -> None:
        super().__init__(tag)
        self.delay_s = _seconds(delay_s)

    async def __call__(self, item: Any, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        if isinstance(item, Request):  # at the ingress: a Request is a Mapping too (of its scope)
            headers = normalize_headers(item.headers.items())
            item = payload_from_body(await item.body())
        delay = item.get("delay_s", self.delay_s) if isinstance(item, Mapping) else self.delay_s
        await asyncio.sleep(_seconds(delay))
        return await super().__call__(item, headers)


class Flaky(Slow):
    """A Slow echo that fails one request in `every` (per replica, counted): a version that
    deploys and answers, and fails a share of what it is sent (a canary's analysis must see it)."""

    def __init__(self, every: int | float = 10, delay_s: float = 0.0, tag: str = "flaky") -> None:
        super().__init__(delay_s, tag)
        # A graph's numbers arrive as floats (google.protobuf.Value): a whole one is a count.
        if (
            isinstance(every, bool)
            or not isinstance(every, int | float)
            or every != int(every)
            or not 1 <= every <= 1e6
        ):
            raise ValueError(f"every must be a whole number in [1, 1000000], got {every!r}")
        self.every = int(every)
        self.calls = 0

    async def __call__(self, item: Any, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
        self.calls += 1
        if self.calls % self.every == 0:
            raise RuntimeError(f"{self.tag}: failing one request in {self.every}")
        return await super().__call__(item, headers)


class Guard:
    """Refuses a prompt containing a blocked word, else passes it on as `{"text": ...}`.

    The unary step in front of a generator: a refused request fails before any token
    is produced, so the client gets an error status rather than a stream.
    """

    def __init__(self, blocked: list[str] | None = None) -> None:
        self.blocked = frozenset(w.lower() for w in (blocked or ["forbidden"]))

    async def __call__(self, item: Any) -> dict[str, Any]:
        text = await text_of(item)
        hits = sorted({w for w in _WORD.findall(text.lower()) if w in self.blocked})
        if hits:
            raise ValueError(f"prompt refused: blocked word(s) {', '.join(hits)}")
        out = dict(item) if isinstance(item, Mapping) else {}
        out["text"] = text
        return out


class TokenGenerator:
    """A deterministic "model" that streams: the prompt's words, cycled, one token at a time.

    Declared `streaming: true` in a graph. Yields `{"model": tag, "index": i, "token": w}`
    for `max_tokens` tokens (the payload's own `max_tokens`, else the constructor's),
    waiting `delay_s` before each one after the first (the payload's `delay_s` overrides it),
    so a client can see items arrive before the stream ends. No model download, no GPU.
    """

    def __init__(self, tag: str = "generator", max_tokens: int = 8, delay_s: float = 0.0) -> None:
        self.tag = tag
        self.max_tokens = _count(max_tokens)
        self.delay_s = _seconds(delay_s)

    async def __call__(self, item: Any) -> AsyncGenerator[dict[str, Any], None]:
        text = await text_of(item)
        words = _WORD.findall(text) or ["..."]
        options = item if isinstance(item, Mapping) else {}
        count = _count(options.get("max_tokens", self.max_tokens))
        delay = _seconds(options.get("delay_s", self.delay_s))
        for i in range(count):
            if i and delay:
                await asyncio.sleep(delay)
            yield {"model": self.tag, "index": i, "token": words[i % len(words)]}


class StreamFilter:
    """A streaming transform: drops tokens on its block list and masks the ones it redacts.

    Called once per item of the stream before it (a sequence step after a generator);
    yields nothing for a dropped token, so the stream just skips it.
    """

    def __init__(self, drop: list[str] | None = None, redact: list[str] | None = None) -> None:
        self.drop = frozenset(w.lower() for w in (drop or []))
        self.redact = frozenset(w.lower() for w in (redact or []))

    async def __call__(self, item: Any) -> AsyncGenerator[Any, None]:
        token = item.get("token") if isinstance(item, Mapping) else None
        if not isinstance(token, str):
            yield item
            return
        if token.lower() in self.drop:
            return
        if token.lower() in self.redact:
            item = {**item, "token": "*" * len(token), "redacted": True}
        yield item


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100_000:
        raise ValueError(f"max_tokens must be an integer in [0, 100000], got {value!r}")
    return value


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise ValueError(f"delay_s must be a finite number ≥ 0, got {value!r}")
    return float(value)
