"""The /metrics guard's decisions and its verdict cache (operator/run/metrics_auth.py), with a
review function standing in for the API server (the real one: tests/integration/test_metrics_auth.py)."""

from __future__ import annotations

from servegraph.kube import KubeError
from servegraph.kube.reviews import Verdict
from servegraph.operator.run import metrics_auth
from servegraph.operator.run.metrics_auth import MetricsGuard


class Reviewer:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.verdicts = {"good": Verdict(True, "sa:prom", "allowed"), "nosy": Verdict(False, "sa:nosy", "no rule")}
        self.down = False

    async def __call__(self, token: str, path: str) -> Verdict:
        self.calls.append(token)
        if self.down:
            raise KubeError("Unavailable", "TokenReview: connection refused")
        return self.verdicts.get(token, Verdict(False, "", "token not valid"))


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_decisions_name_the_problem() -> None:
    guard = MetricsGuard(Reviewer())
    assert await guard.check(None, "/metrics") == (401, "a bearer token is required")
    assert await guard.check("Basic dXNlcjpwdw==", "/metrics") == (401, "a bearer token is required")
    assert await guard.check("Bearer made-up", "/metrics") == (401, "the token is not valid")
    assert await guard.check("Bearer nosy", "/metrics") == (403, "user 'sa:nosy' may not get /metrics")
    assert await guard.check("bearer good", "/metrics") == (200, "allowed")


async def test_verdicts_are_kept_for_their_ttl_allowed_longer_than_denied() -> None:
    reviewer, clock = Reviewer(), Clock()
    guard = MetricsGuard(reviewer, clock)
    for _ in range(3):
        await guard.check("Bearer good", "/metrics")
        await guard.check("Bearer nosy", "/metrics")
    assert reviewer.calls == ["good", "nosy"]
    clock.now += metrics_auth.DENIED_TTL_S + 1
    await guard.check("Bearer good", "/metrics")
    await guard.check("Bearer nosy", "/metrics")
    assert reviewer.calls == ["good", "nosy", "nosy"], "only the denial expired"
    clock.now += metrics_auth.ALLOWED_TTL_S
    await guard.check("Bearer good", "/metrics")
    assert reviewer.calls[-1] == "good"


async def test_an_api_outage_is_503_and_not_remembered() -> None:
    reviewer = Reviewer()
    guard = MetricsGuard(reviewer)
    reviewer.down = True
    assert (await guard.check("Bearer good", "/metrics"))[0] == 503
    reviewer.down = False
    assert await guard.check("Bearer good", "/metrics") == (200, "allowed")
    assert reviewer.calls == ["good", "good"]


async def test_made_up_tokens_cannot_grow_the_cache() -> None:
    guard = MetricsGuard(Reviewer())
    for i in range(metrics_auth.MAX_ENTRIES + 50):
        await guard.check(f"Bearer junk-{i}", "/metrics")
    assert len(guard._verdicts) == metrics_auth.MAX_ENTRIES
    assert not any("junk" in key for key in guard._verdicts), "keys are digests, never tokens"
