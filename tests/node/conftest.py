"""The node tier: one real cluster (kubelet, containerd, CNI, kube-proxy, CoreDNS,
controllers) with KubeRay and servegraph installed as users install them, for the session.

Every test under tests/node is marked `node` and gets its own namespace. Afterwards its Ray
pods are stopped at once, so the next test has the node's two CPUs to itself, and the
namespace is deleted by the real garbage collector and namespace controller while the next
test runs; the session waits for every one to be gone (`node_support.discard`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from node_support import FIGURES, discard, wait_discarded

from servegraph_testbed.node.stack import Stack

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.node)
    # Tests that start a node of their own (the demo) run before the session's `stack`
    # exists: one node at a time holds the machine's node lock, so after it they would wait
    # for the session's node, which is torn down only at the end — whatever file names sort.
    items.sort(key=lambda item: "stack" in getattr(item, "fixturenames", ()))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("node-tier figures")
        for line in FIGURES:
            terminalreporter.write_line(line)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed node test carries what the operator said and the ServeGraphs' status: the
    cluster is gone by the time anyone reads the report."""
    report = yield
    stack = getattr(item, "funcargs", {}).get("stack")
    if report.failed and call.when == "call" and isinstance(stack, Stack) and stack.installed is not None:
        installed = stack.installed
        logs = stack.cp.kubectl(
            "logs",
            "-n",
            installed.operator_namespace,
            "-l",
            "app.kubernetes.io/name=servegraph-operator",  # both replicas: the leader may have moved
            "--all-containers",
            "--prefix",
            "--tail=120",
            check=False,
        ).stdout
        sgs = stack.cp.kubectl("get", "servegraphs", "-A", "-o", "yaml", check=False).stdout
        report.sections.append(("operator logs (last 120 lines of each replica)", logs[-20000:]))
        report.sections.append(("ServeGraphs", sgs[-20000:]))
    return report


@pytest.fixture(scope="session")
async def stack() -> AsyncIterator[Stack]:
    """A NodeCluster (2 advertised GPUs) + KubeRay + servegraph (Helm, 2 replicas) + registry."""
    async with Stack() as s:
        yield s
        await wait_discarded(s)


@pytest.fixture
async def namespace(stack: Stack) -> AsyncIterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    yield name
    discard(stack, name)
