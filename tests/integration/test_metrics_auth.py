"""/metrics behind TokenReview + SubjectAccessReview on the real API server: the shipped
reader ClusterRole grants it to a ServiceAccount's real token; no token, a made-up
token, and a valid token without the grant are refused; probes stay open."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from sg_support import OPERATOR_USER, bind_operator_rbac, read_log, start_operator

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
