"""Helpers the e2e tests import (conftest modules are not importable reliably: several exist)."""

from __future__ import annotations

import io
import os
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from rayhead import RayHead

from servegraph.raydash import up
from servegraph.raydash.dashboard import RayDashboard

HERE = Path(__file__).resolve().parent
WORKER_PATH = f"{HERE}:{HERE.parent.parent / 'src'}"
"""The Ray workers' PYTHONPATH: `e2e_apps`, and the servegraph under test before the one the
virtualenv installed (from a worktree, the venv's editable install is another checkout's)."""
GRAPHS = HERE / "graphs"
WORKER_PATH = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
"""The head's PYTHONPATH: this directory (`e2e_apps`), then the test run's own, so that Ray's
workers import servegraph from the checkout under test (a worktree's src) and not from
wherever the virtualenv's editable install points."""
E2E_GRAPH = GRAPHS / "e2e.txtpb"
SAMPLES = HERE.parent.parent / "config" / "samples"


async def start_serve(head: RayHead, port: int) -> None:
    """Start Serve's proxy on `port` (an empty declarative config starts the controller)."""
    async with RayDashboard(head.address, head.token) as dash:
        await dash.put_applications({"http_options": {"host": "127.0.0.1", "port": port}, "applications": []})


async def ensure_deployed(head: RayHead, graph: Path, timeout_s: float = 300.0) -> None:
    """Deploy `graph` with `servegraph up` unless exactly its rendered apps already run."""
    _, config = up.render(graph)
    wanted = {app["name"]: app for app in config["applications"]}
    async with RayDashboard(head.address, head.token) as client:
        state = await client.get_applications()
    if set(state.applications) == set(wanted) and all(
        a.status == "RUNNING" and a.deployed_app_config == wanted[name] for name, a in state.applications.items()
    ):
        return
    out, err = io.StringIO(), io.StringIO()
    code = await up.up(graph, address=head.address, token=head.token, timeout_s=timeout_s, out=out, err=err)
    assert code == 0, f"servegraph up {graph.name} failed ({code}):\n{err.getvalue()}"


async def request(
    http: aiohttp.ClientSession,
    url: str,
    body: Any = None,
    *,
    data: str | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """POST JSON (or raw text) and return (status, parsed JSON body)."""
    async with http.post(url, json=body if data is None else None, data=data, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


def scrape_metrics(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Ray's metrics endpoint, as {sample name: [(labels, value)]} for servegraph's metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("ray_servegraph_"):
                out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def metric_total(samples: list[tuple[dict[str, str], float]], **labels: str) -> float:
    return sum(v for tags, v in samples if all(tags.get(k) == want for k, want in labels.items()))
