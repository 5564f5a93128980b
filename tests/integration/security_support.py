"""What the security tests share: an operator started with the administrator's tighter limits
and an events endpoint, and a few helpers over the audit log and the command line."""

from __future__ import annotations

import base64
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from sg_support import OPERATOR_USER, Kit, bind_operator_rbac, start_operator
from support import REGISTRY_TOKEN

from servegraph_testbed import Component, ControlPlane
from servegraph_testbed.processes import free_port
from servegraph_testbed.registry import RegistryServer

SYSTEM_NS = "servegraph-system"
EVENTS_TOKEN = "s3curity-ev3nts-t0ken"
MAX_FETCH_SECONDS = 3
MAX_GRAPH_BYTES = 65536


@dataclass
class Secured:
    component: Component
    events_port: int
    health_port: int

    @property
    def log(self) -> str:
        return self.component.log_path.read_text(errors="replace")

    async def metric(self, sample: str, **labels: str) -> float:
        """The sum of the operator's /metrics samples named `sample` that carry `labels`
        (0 when there are none yet)."""
        url = f"http://127.0.0.1:{self.health_port}/metrics"
        async with aiohttp.ClientSession() as session, session.get(url) as resp:
            resp.raise_for_status()
            text = await resp.text()
        return sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == sample and labels.items() <= s.labels.items()
        )


def start_secured(cp: ControlPlane, name: str) -> Iterator[Secured]:
    """An operator as a careful administrator runs it: downloads capped at 3 s and 64 KiB."""
    bind_operator_rbac(cp)
    cp.kubectl("create", "namespace", SYSTEM_NS, check=False)
    token = base64.b64encode(EVENTS_TOKEN.encode()).decode()
    cp.kubectl(
        "apply", "-f", "-",
        stdin=f"apiVersion: v1\nkind: Secret\nmetadata: {{name: {name}-events, namespace: {SYSTEM_NS}}}\ndata: {{token: {token}}}\n",
    )  # fmt: skip
    events_port = free_port()
    component, health_port = start_operator(
        cp,
        name,
        f"--max-fetch-seconds={MAX_FETCH_SECONDS}",
        f"--max-graph-bytes={MAX_GRAPH_BYTES}",
        f"--events-address=127.0.0.1:{events_port}",
        f"--events-token-secret={SYSTEM_NS}/{name}-events",
    )
    secured = Secured(component, events_port, health_port)
    yield secured
    cp.unspawn(component)
    log = secured.log
    assert REGISTRY_TOKEN not in log and EVENTS_TOKEN not in log, "a token reached the operator's log"
    assert "Traceback" not in log, component.log_tail()


def operator_writes(cp: ControlPlane, namespace: str, since: int, resource: str | None = None) -> list[Any]:
    from servegraph_testbed import WRITE_VERBS

    return cp.audit_log.events(
        user=OPERATOR_USER, verbs=WRITE_VERBS, resource=resource, namespace=namespace, since=since
    )


def fetch_cli(tmp: Path, url: str, *args: str, ca_pem: str | None = None) -> subprocess.CompletedProcess[str]:
    """`servegraph fetch` as an administrator debugging a source would run it."""
    token = tmp / "token"
    token.write_text(REGISTRY_TOKEN + "\n")
    argv = [sys.executable, "-m", "servegraph.cli", "fetch", url, "--token-file", str(token), *args]
    if ca_pem is not None:
        ca = tmp / "ca.crt"
        ca.write_text(ca_pem)
        argv += ["--ca-file", str(ca)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


@contextlib.asynccontextmanager
async def secured_kit(admin_api: Any, namespace: str, registry: RegistryServer, ca_pem: str) -> AsyncIterator[Kit]:
    """A Kit whose namespace holds the registry's token and CA; afterwards the registry's
    faults and the namespace's ServeGraphs are gone, so the next test starts clean."""
    k = Kit(admin_api, namespace, registry, ca_pem)
    await k.secret("registry-token", {"token": REGISTRY_TOKEN})
    await k.secret("registry-ca", {"ca.crt": ca_pem})
    yield k
    registry.registry.faults.clear()
    await k.custom.delete_collection_namespaced_custom_object("servegraph.io", "v1alpha1", namespace, "servegraphs")
