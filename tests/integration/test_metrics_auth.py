"""/metrics behind TokenReview + SubjectAccessReview on the real API server: the shipped
reader ClusterRole grants it to a ServiceAccount's real token; no token, a made-up
token, and a valid token without the grant are refused; probes stay open."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from sg_support import OPERATOR_USER, bind_operator_rbac, read_log, start_operator

from servegraph.operator.run.events_endpoint import FailedAuth
from servegraph_testbed import Component, ControlPlane

ROOT = Path(__file__).resolve().parents[2]
METRICS_AUTH = ROOT / "config" / "rbac" / "metrics_auth.yaml"
PORT: dict[str, int] = {}
TOKENS: list[str] = []


def _reader_role() -> dict[str, object]:
    [role] = [d for d in yaml.safe_load_all(METRICS_AUTH.read_text()) if d and d["kind"] == "ClusterRole"]
    return role


def _delegation_binding() -> dict[str, object]:
    """config/rbac's auth-delegator binding, for the test's operator identity (a User)."""
    [binding] = [d for d in yaml.safe_load_all(METRICS_AUTH.read_text()) if d and d["kind"] == "ClusterRoleBinding"]
    binding["metadata"] = {"name": "servegraph-operator-test-auth-delegator"}
    binding["subjects"] = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": OPERATOR_USER}]
    return binding


@pytest.fixture(scope="module")
def operator(control_plane: ControlPlane) -> Iterator[Component]:
    bind_operator_rbac(control_plane)
    docs = [_reader_role(), _delegation_binding()]
    control_plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))
    component, PORT["health"] = start_operator(control_plane, "servegraph-metrics-auth", "--metrics-auth=kubernetes")
    yield component
    control_plane.unspawn(component)
    log = read_log(component.log_path)
    for token in TOKENS:
        assert token not in log, "a scraper's token reached the operator's log"


def _account(cp: ControlPlane, namespace: str, name: str, role: str | None) -> str:
    """A ServiceAccount (bound to the ClusterRole `role`, if any) and a real token of it."""
    cp.kubectl("create", "serviceaccount", name, "-n", namespace)
    if role is not None:
        cp.kubectl(
            "create", "clusterrolebinding", f"{namespace}-{name}", f"--clusterrole={role}",
            f"--serviceaccount={namespace}:{name}",
        )  # fmt: skip
    token = cp.service_account_token(namespace, name)
    TOKENS.append(token)
    return token


async def _get(path: str, token: str | None = None) -> tuple[int, str, str | None]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.get(f"http://127.0.0.1:{PORT['health']}{path}", headers=headers) as resp,
    ):
        return resp.status, await resp.text(), resp.headers.get("WWW-Authenticate")


async def test_a_token_bound_to_the_reader_role_reads_metrics(
    control_plane: ControlPlane, operator: Component, namespace: str
) -> None:
    token = _account(control_plane, namespace, "prometheus", str(_reader_role()["metadata"]["name"]))  # type: ignore[index]
    status, body, _ = await _get("/metrics", token)
    assert status == 200, body
    assert "servegraph_reconciles_total" in body


async def test_without_a_valid_token_metrics_are_refused_and_probes_are_not(
    control_plane: ControlPlane, operator: Component, namespace: str
) -> None:
    status, body, challenge = await _get("/metrics")
    assert (status, challenge) == (401, 'Bearer realm="servegraph"'), body
    assert "servegraph_" not in body
    made_up = "eyJhbGciOiJSUzI1NiJ9.bm90LWEtdG9rZW4.c2lnbmF0dXJl"
    TOKENS.append(made_up)
    status, body, _ = await _get("/metrics", made_up)
    assert status == 401 and "not valid" in body, body
    for probe in ("/healthz", "/readyz"):
        assert (await _get(probe))[0] == 200


async def test_a_valid_token_without_the_grant_is_forbidden_and_named(
    control_plane: ControlPlane, operator: Component, namespace: str
) -> None:
    token = _account(control_plane, namespace, "curious", None)
    status, body, _ = await _get("/metrics", token)
    assert status == 403, body
    assert f"system:serviceaccount:{namespace}:curious" in body and "servegraph_" not in body
    assert token not in body


async def _flood(tokens: list[str], answered: asyncio.Event, first: int) -> list[int]:
    """GET /metrics with each token at once, from 127.0.0.2 (another client than Prometheus's
    127.0.0.1); `answered` is set once `first` answers are in."""
    statuses: list[int] = []
    connector = aiohttp.TCPConnector(limit=0, local_addr=("127.0.0.2", 0))  # all at once, as an attacker would
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:

        async def one(token: str) -> None:
            headers = {"Authorization": f"Bearer {token}"}
            async with session.get(f"http://127.0.0.1:{PORT['health']}/metrics", headers=headers) as resp:
                await resp.read()
                statuses.append(resp.status)
                if len(statuses) >= first:
                    answered.set()

        await asyncio.gather(*(one(t) for t in tokens))
    return statuses


@pytest.mark.parametrize("shape", ["opaque", "jwt"])
async def test_a_flood_of_junk_tokens_does_not_hold_prometheus_scrape(
    control_plane: ControlPlane, operator: Component, namespace: str, shape: str
) -> None:
    """Issue 45: 2,000 junk tokens queued 2,001 TokenReviews behind four; Prometheus's scrape
    (its verdict not kept yet) was answered after 10.2 s, past its own 10 s timeout."""
    token = _account(control_plane, namespace, f"prometheus-{shape}", str(_reader_role()["metadata"]["name"]))  # type: ignore[index]
    head = "eyJhbGciOiJSUzI1NiJ9"  # {"alg":"RS256"}: shaped as a JWT, signed by nobody
    junk = [f"junk-{i}" if shape == "opaque" else f"{head}.{i:x}.c2ln" for i in range(2000)]
    answered = asyncio.Event()
    mark = control_plane.audit_log.offset()
    flood_started = time.monotonic()
    flood = asyncio.ensure_future(_flood(junk, answered, first=200))
    async with asyncio.timeout(60):
        await answered.wait()  # the flood is on
    started = time.monotonic()
    status, body, _ = await _get("/metrics", token)
    took = time.monotonic() - started
    statuses = await flood
    flood_s = time.monotonic() - flood_started
    reviews = control_plane.audit_log.events(user=OPERATOR_USER, resource="tokenreviews", since=mark)
    assert status == 200, body
    # Prometheus gives up on a scrape after 10 s (scrape_timeout's default): the user-visible bound.
    assert took < 10.0, f"Prometheus's scrape waited {took:.1f} s behind the flood"
    # The flood's address may fail five times (FailedAuth), and once more every 2 s the flood
    # lasts, then gets 429 without a review: the scrape queues behind a handful, not 2,000.
    refill = FailedAuth()  # the operator's: its defaults
    allowed = refill.burst + int(flood_s * refill.rate) + 1
    assert set(statuses) <= {401, 429} and statuses.count(401) <= allowed, (
        f"{statuses.count(401)} reviewed junk tokens over {flood_s:.1f} s (at most {allowed})"
    )
    assert len(reviews) <= allowed + 1, f"{len(reviews)} TokenReviews for 2,000 junk tokens and one scrape"
