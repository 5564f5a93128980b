"""The shipped example deployments: tiny, deterministic, and tolerant of both payloads and requests."""

from __future__ import annotations

import math
from typing import Any

import pytest
from starlette.requests import Request

from servegraph.examples import Embedder, MajorityVote, Sentiment, Tokenizer, text_of


class LocalHandle:
    """A DeploymentHandle stand-in that calls the object in-process."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def remote(self, *args: Any) -> Any:
        return self.target(*args)


def http_request(body: bytes) -> Request:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""}, receive)


async def test_text_comes_from_requests_payload_dicts_and_strings() -> None:
    assert await text_of(http_request(b'{"text": "Hi there"}')) == "Hi there"
    assert await text_of(http_request(b"raw body")) == "raw body"
    assert await text_of({"text": "from a router"}) == "from a router"
    assert await text_of("plain") == "plain"
    with pytest.raises(ValueError, match=r'expected a string or \{"text": <string>\}, got int'):
        await text_of({"text": 3})


async def test_tokenizer_splits_words_and_lowercases_on_request() -> None:
    assert await Tokenizer()("Don't STOP, me now!") == ["don't", "stop", "me", "now"]
    assert await Tokenizer(lowercase=False)("Don't STOP") == ["Don't", "STOP"]


async def test_sentiment_scores_polarity_and_threshold_comes_from_user_config() -> None:
    model = Sentiment(LocalHandle(Tokenizer()))
    assert await model(http_request(b'{"text": "I love this great movie"}')) == {"label": "positive", "score": 1.0}
    assert await model({"text": "awful and boring"}) == {"label": "negative", "score": -1.0}
    assert await model("no opinion here") == {"label": "neutral", "score": 0.0}
    mixed = "good and great, but boring"
    assert await model(mixed) == {"label": "positive", "score": 0.3333}
    model.reconfigure({"threshold": 0.5})
    assert await model(mixed) == {"label": "neutral", "score": 0.3333}


async def test_sentiment_word_lists_are_configurable_and_case_insensitive() -> None:
    model = Sentiment(LocalHandle(Tokenizer(lowercase=False)), positive=["Rust"], negative=["segfault"])
    assert await model("rust without a SEGFAULT, rust") == {"label": "positive", "score": 0.3333}


async def test_embedder_is_deterministic_normalized_and_uses_the_tokenizer_when_bound() -> None:
    alone = Embedder(dimensions=16)
    vector = (await alone({"text": "the quick brown fox"}))["embedding"]
    assert len(vector) == 16
    assert math.isclose(sum(v * v for v in vector), 1.0, rel_tol=1e-5)
    assert (await Embedder(dimensions=16)("The QUICK brown fox"))["embedding"] == vector
    bound = Embedder(LocalHandle(Tokenizer()), dimensions=16.0)  # a JSON number may arrive as a float
    assert (await bound("the quick brown fox"))["embedding"] == vector
    assert (await alone("a different sentence"))["embedding"] != vector
    assert (await alone(""))["embedding"] == [0.0] * 16


@pytest.mark.parametrize("dimensions", [0, -1, 2.5, True])
def test_embedder_rejects_bad_dimensions(dimensions: Any) -> None:
    with pytest.raises(ValueError, match="dimensions must be a positive integer"):
        Embedder(dimensions=dimensions)


def test_majority_vote_counts_labels_and_breaks_ties_alphabetically() -> None:
    vote = MajorityVote()
    results = {"a": {"label": "positive", "score": 1}, "b": "negative", "c": {"label": "positive"}, "d": 3}
    assert vote(results) == {"label": "positive", "votes": {"negative": 1, "positive": 2}}
    assert vote({"a": "neutral", "b": "negative"}) == {"label": "negative", "votes": {"negative": 1, "neutral": 1}}
    assert vote({}) == {"label": None, "votes": {}}


async def test_slow_at_the_ingress_waits_the_requests_own_delay() -> None:
    """A Request is a Mapping (of its ASGI scope): Slow must read the body's delay_s, not the scope."""
    import time

    from servegraph.examples import Slow

    start = time.monotonic()
    out = await Slow(delay_s=5.0)(http_request(b'{"delay_s": 0.05, "x": 1}'))
    assert time.monotonic() - start < 2.0
    assert out["payload"] == {"delay_s": 0.05, "x": 1}


async def test_flaky_fails_one_request_in_every_and_answers_the_rest() -> None:
    from servegraph.examples import Flaky

    flaky = Flaky(every=3, tag="v3")
    outcomes = []
    for i in range(6):
        try:
            outcomes.append((await flaky({"i": i}))["node"])
        except RuntimeError as e:
            outcomes.append(str(e))
    assert outcomes == ["v3", "v3", "v3: failing one request in 3", "v3", "v3", "v3: failing one request in 3"]
    assert Flaky(every=3.0).every == 3, "a graph's numbers arrive as floats"
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="every must be a whole number"):
            Flaky(every=bad)
