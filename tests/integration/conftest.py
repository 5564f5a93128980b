"""Fixtures for tests against the real control plane (etcd + kube-apiserver + KubeRay).

Every test under tests/integration is marked `integration`. The control plane and the
KubeRay operator are started once per session, on first use; each test gets its own
namespace. There is no kubelet and no controller-manager: pods stay Pending, owner
references are never garbage collected, deleted namespaces stay Terminating.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from sg_support import delete_namespace

from servegraph_testbed import Binaries, ControlPlane, KubeRayOperator, find_binaries
from servegraph_testbed.clients import api_client

OUR_CRDS = Path(__file__).resolve().parents[2] / "config" / "crd"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def testenv_binaries() -> Binaries:
    """The kube-apiserver/etcd/kubectl/kuberay-operator/helm directory ($SERVEGRAPH_TESTENV)."""
    return find_binaries()


@pytest.fixture(scope="session")
def control_plane(testenv_binaries: Binaries) -> Iterator[ControlPlane]:
    """The session's etcd + kube-apiserver, with KubeRay's CRDs, ours (config/crd) and audit.

    Identities: admin, servegraph-operator, kuberay-operator, restricted-user (the last
    three with no permissions until a test binds some); `cp.kubeconfig(name)` for each.
    `cp.audit_log.events(user=..., since=cp.audit_log.offset())` counts requests.
    """
    crds = [testenv_binaries.kuberay_crds]
    if OUR_CRDS.is_dir():
        crds.append(OUR_CRDS)
    with ControlPlane(testenv_binaries, crds=crds, audit=True) as cp:
        yield cp


@pytest.fixture(scope="session")
def kuberay(control_plane: ControlPlane) -> Iterator[KubeRayOperator]:
    """The real KubeRay operator (all namespaces, as `kuberay-operator` with its shipped
    ClusterRole and feature gates: RayServiceIncrementalUpgrade is on by default since
    KubeRay 1.7); started by the first test that asks for it, stopped at session end."""
    with KubeRayOperator(control_plane) as operator:
        yield operator


@pytest.fixture(scope="session")
async def admin_api(control_plane: ControlPlane) -> AsyncIterator[Any]:
    """A kubernetes_asyncio ApiClient as admin (system:masters), shared by the session."""
    async with api_client(control_plane) as api:
        yield api


@pytest.fixture
async def api_client_for(
    control_plane: ControlPlane,
) -> AsyncIterator[Callable[..., Awaitable[Any]]]:
    """`await api_client_for("restricted-user")` (or `token=...`): an ApiClient as that
    identity, closed after the test."""
    opened: list[Any] = []

    async def make(identity: str = "admin", *, token: str | None = None) -> Any:
        api = api_client(control_plane, identity, token=token)
        opened.append(api)
        return api

    yield make
    for api in opened:
        await api.close()


@pytest.fixture
async def namespace(admin_api: Any) -> AsyncIterator[str]:
    """A fresh namespace for one test (its name), deleted with its ServeGraphs at teardown."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(admin_api)
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    await delete_namespace(admin_api, name)
