"""The /metrics guard's decisions and its verdict cache (operator/run/metrics_auth.py), with a
review function standing in for the API server (the real one: tests/integration/test_metrics_auth.py)."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from servegraph.kube import KubeError
from servegraph.kube.reviews import Verdict
from servegraph.operator.run import metrics_auth
from servegraph.operator.run.metrics_auth import MetricsGuard, jwt_shaped


def jwt(subject: str) -> str:
    """A token shaped as Kubernetes issues them (not signed: the reviewer here reads the subject)."""

    def part(value: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    return f"{part({'alg': 'ES256', 'kid': 'k'})}.{part({'sub': subject})}.c2lnbmF0dXJl"


def subject(token: str) -> str:
    body = token.split(".")[1]
    return str(json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))["sub"])


GOOD, NOSY = jwt("good"), jwt("nosy")


class Reviewer:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.verdicts = {"good": Verdict(True, "sa:prom", "allowed"), "nosy": Verdict(False, "sa:nosy", "no rule")}
        self.down = False
        self.gate: asyncio.Event | None = None
        """Set: every review waits for it (an API server that is slow to answer)."""

    async def __call__(self, token: str, path: str) -> Verdict:
        self.calls.append(subject(token))
        if self.gate is not None:
            await self.gate.wait()
        if self.down:
            raise KubeError("Unavailable", "TokenReview: connection refused")
        return self.verdicts.get(subject(token), Verdict(False, "", "token not valid"))


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_decisions_name_the_problem() -> None:
    guard = MetricsGuard(Reviewer())
    assert await guard.check(None, "/metrics", "a") == (401, "a bearer token is required")
    assert await guard.check("Basic dXNlcjpwdw==", "/metrics", "b") == (401, "a bearer token is required")
    assert await guard.check(f"Bearer {jwt('made-up')}", "/metrics", "c") == (401, "the token is not valid")
    assert await guard.check(f"Bearer {NOSY}", "/metrics", "d") == (403, "user 'sa:nosy' may not get /metrics")
    assert await guard.check(f"bearer {GOOD}", "/metrics", "e") == (200, "allowed")


async def test_verdicts_are_kept_for_their_ttl_allowed_longer_than_denied() -> None:
    reviewer, clock = Reviewer(), Clock()
    guard = MetricsGuard(reviewer, clock)
    for _ in range(3):
        await guard.check(f"Bearer {GOOD}", "/metrics", "prometheus")
        await guard.check(f"Bearer {NOSY}", "/metrics", "nosy")
    assert reviewer.calls == ["good", "nosy"]
    clock.now += metrics_auth.DENIED_TTL_S + 1
    await guard.check(f"Bearer {GOOD}", "/metrics", "prometheus")
    await guard.check(f"Bearer {NOSY}", "/metrics", "nosy")
    assert reviewer.calls == ["good", "nosy", "nosy"], "only the denial expired"
    clock.now += metrics_auth.ALLOWED_TTL_S
    await guard.check(f"Bearer {GOOD}", "/metrics", "prometheus")
    assert reviewer.calls[-1] == "good"


async def test_an_api_outage_is_503_and_not_remembered() -> None:
    reviewer = Reviewer()
    guard = MetricsGuard(reviewer)
    reviewer.down = True
    assert (await guard.check(f"Bearer {GOOD}", "/metrics"))[0] == 503
    reviewer.down = False
    assert await guard.check(f"Bearer {GOOD}", "/metrics") == (200, "allowed")
    assert reviewer.calls == ["good", "good"]


async def test_made_up_tokens_cannot_grow_the_cache() -> None:
    guard = MetricsGuard(Reviewer())
    for i in range(metrics_auth.MAX_ENTRIES + 50):
        await guard.check(f"Bearer {jwt(f'junk-{i}')}", "/metrics", f"10.0.{i // 256}.{i % 256}")
    assert len(guard._verdicts) == metrics_auth.MAX_ENTRIES
    assert not any("junk" in key or "." in key for key in guard._verdicts), "keys are digests, never tokens"


# -- issue 45, item 8: junk must not queue reviews ahead of Prometheus -----------------------


@pytest.mark.parametrize(
    "token",
    ["made-up", "a.b", "a.b.c.d", "e30.e30.sig", "bm90IGpzb24.e30.sig", "x" * 20_000 + ".e30.sig", "é.e30.sig"],
    ids=["opaque", "two-parts", "four-parts", "no-alg", "not-json", "huge", "not-base64url"],
)
async def test_a_token_that_is_no_jwt_is_refused_without_a_review(token: str) -> None:
    reviewer = Reviewer()
    guard = MetricsGuard(reviewer)
    assert not jwt_shaped(token)
    assert await guard.check(f"Bearer {token}", "/metrics", "p") == (401, "the token is not valid")
    assert reviewer.calls == []
    assert jwt_shaped(GOOD)


async def test_an_address_that_keeps_failing_gets_429_before_its_token_is_looked_at() -> None:
    reviewer, clock = Reviewer(), Clock()
    guard = MetricsGuard(reviewer, clock)
    for i in range(5):  # FailedAuth's burst
        assert (await guard.check(f"Bearer {jwt(f'guess-{i}')}", "/metrics", "10.0.0.9"))[0] == 401
    assert await guard.check(f"Bearer {jwt('guess-5')}", "/metrics", "10.0.0.9") == (
        429, "too many failed authentications; slow down"
    )  # fmt: skip
    assert await guard.check("Bearer junk", "/metrics", "10.0.0.9") == (
        429,
        "too many failed authentications; slow down",
    )
    assert len(reviewer.calls) == 5
    assert await guard.check(f"Bearer {GOOD}", "/metrics", "10.0.0.1") == (200, "allowed")  # another address
    clock.now += 2.0  # one more try every 2 s
    assert (await guard.check(f"Bearer {jwt('guess-6')}", "/metrics", "10.0.0.9"))[0] == 401


async def test_reviews_waiting_are_bounded_and_prometheus_does_not_wait_behind_them() -> None:
    reviewer = Reviewer()
    guard = MetricsGuard(reviewer)
    assert await guard.check(f"Bearer {GOOD}", "/metrics", "prometheus") == (200, "allowed")  # its verdict is kept
    reviewer.gate = asyncio.Event()
    bound = metrics_auth.MAX_IN_FLIGHT + metrics_auth.MAX_WAITING
    waiting = [
        asyncio.ensure_future(guard.check(f"Bearer {jwt(f'junk-{i}')}", "/metrics", f"10.0.1.{i}"))
        for i in range(bound)
    ]
    await asyncio.sleep(0)
    assert len(reviewer.calls) == 1 + metrics_auth.MAX_IN_FLIGHT  # the rest wait their turn
    assert await guard.check(f"Bearer {jwt('one-more')}", "/metrics", "10.0.2.1") == (
        503, "too many token reviews at once; try again"
    )  # fmt: skip
    assert await guard.check(f"Bearer {GOOD}", "/metrics", "prometheus") == (200, "allowed")  # at once
    reviewer.gate.set()
    assert {status for status, _ in await asyncio.gather(*waiting)} == {401}
    assert guard._reviewing == 0


async def test_one_address_may_have_two_reviews_pending_so_it_cannot_fill_the_queue() -> None:
    """2,000 requests from one address arrive before any review ends, so before any failure counts."""
    reviewer = Reviewer()
    reviewer.gate = asyncio.Event()
    guard = MetricsGuard(reviewer)
    pending = [asyncio.ensure_future(guard.check(f"Bearer {jwt(f'j-{i}')}", "/metrics", "10.0.0.9")) for i in range(2)]
    await asyncio.sleep(0)
    assert await guard.check(f"Bearer {jwt('j-2')}", "/metrics", "10.0.0.9") == (
        429, "too many token reviews at once from this address; slow down"
    )  # fmt: skip
    reviewer.gate.set()
    assert [status for status, _ in await asyncio.gather(*pending)] == [401, 401]
    assert guard._by_peer == {}
