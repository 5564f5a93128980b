"""One real Ray 2.60 head for the e2e session, reached only through its dashboard REST API.

Every test under tests/e2e is marked `e2e`. The head runs with token auth on
(RAY_AUTH_MODE=token, a random RAY_AUTH_TOKEN) and with this directory on
PYTHONPATH so its workers import `e2e_apps`. Serve is started on a free
127.0.0.1 port before any config is deployed: the rendered configs ask for
0.0.0.0:8000, which Serve ignores once it runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest
from e2e_support import E2E_GRAPH, HERE, WORKER_PATH, ensure_deployed, start_serve
from rayhead import RayHead, free_port, running_head

from servegraph.raydash.dashboard import RayDashboard


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def spans_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where Ray Serve's tracing (on for the session head) writes every span, one JSON a line."""
    return tmp_path_factory.mktemp("spans") / "spans.jsonl"


@pytest.fixture(scope="session")
def ray_head(spans_file: Path) -> Iterator[RayHead]:
    # Ray Serve's own tracing is on, sampling only requests that arrive with a sampled
    # traceparent (ratio 0): the other tests send none and record no span.
    tracing = {
        "RAY_SERVE_TRACING_EXPORTER_IMPORT_PATH": "e2e_apps:span_processors",
        "RAY_SERVE_TRACING_SAMPLING_RATIO": "0",
        "SERVEGRAPH_E2E_SPANS": str(spans_file),
    }
    with running_head(num_cpus=2, extra_env={"PYTHONPATH": WORKER_PATH, **tracing}) as head:
        yield head


@pytest.fixture(scope="session")
async def serve_port(ray_head: RayHead) -> int:
    port = free_port()
    await start_serve(ray_head, port)
    return port


@pytest.fixture(scope="session")
def serve_url(serve_port: int) -> Callable[[str], str]:
    return lambda path: f"http://127.0.0.1:{serve_port}{path}"


@pytest.fixture
async def dash(ray_head: RayHead, serve_port: int) -> AsyncIterator[RayDashboard]:
    async with RayDashboard(ray_head.address, ray_head.token) as client:
        yield client


@pytest.fixture(scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(limit=32)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        yield session


@pytest.fixture
async def e2e_graph(ray_head: RayHead, serve_port: int) -> Path:
    await ensure_deployed(ray_head, E2E_GRAPH)
    return E2E_GRAPH
