"""Fixtures every test folder may use: KubeRay's CRDs and a real HTTPS graph registry."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme
from support import REGISTRY_TOKEN

from servegraph_testbed import find_manifests
from servegraph_testbed.binaries import Binaries
from servegraph_testbed.registry import Registry, RegistryServer

pytest_plugins = ("servegraph_testbed.pytest_plugin",)  # SIGTERM tears down like Ctrl-C
VERSIONS = Binaries(Path()).versions  # hack/testenv/versions.env: {"KUBERAY": "v1.7.0", ...}


@pytest.fixture(scope="session", params=["KUBERAY", "KUBERAY_PREVIOUS"], ids=lambda v: VERSIONS[v])
def kuberay_crds(request: pytest.FixtureRequest) -> Path:
    """KubeRay's own CRD files, from its Go module: every test of a render against them runs
    twice, against the KubeRay the test bed runs and the previous one servegraph supports."""
    binaries = find_manifests()
    return (binaries if request.param == "KUBERAY" else binaries.kuberay_previous).kuberay_crds


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    """A throwaway CA: the registry's certificate is trusted only by who is given it."""
    return trustme.CA()


@pytest.fixture(scope="session")
def server_ssl(ca: trustme.CA) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(ctx)
    return ctx


@pytest.fixture
def ca_pem(ca: trustme.CA) -> str:
    return ca.cert_pem.bytes().decode()


@pytest.fixture
async def registry(server_ssl: ssl.SSLContext) -> AsyncIterator[RegistryServer]:
    """A real HTTPS registry on loopback that checks REGISTRY_TOKEN as a bearer token."""
    async with RegistryServer(Registry(token=REGISTRY_TOKEN), server_ssl) as server:
        yield server
