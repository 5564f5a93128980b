"""What the reconcile does with what it cannot do: an exception nobody foresaw in any of its
steps, a request quantity in an unusual form, a rendered RayService too large to store."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from reconcile_support import KEY, MINI, NAME, TOKEN, Cluster

from servegraph.operator import reconcile, unexpected
from servegraph.operator.apply import rendering, writer
from servegraph.operator.apply.objectsize import MAX_RAYSERVICE_BYTES, too_large
from servegraph.operator.apply.writer import RayServiceWriter
from servegraph.operator.fetch import download
from servegraph.operator.queue import WorkQueue
from servegraph.operator.reconcile import Reconciler, RetryLater
from servegraph.operator.rollout import step as progress
from servegraph.operator.run.worker import run_worker
from servegraph.render import render_rayservice
from servegraph.v1 import graph_pb2

SECRET_TEXT = f"token={TOKEN}"
"""What a careless exception message could carry: it must reach no condition or Event."""


def internal_errors(c: Cluster, step: str, exception: str) -> float:
    value = c.reconciler.metrics.registry.get_sample_value(
        "servegraph_internal_errors_total", {"step": step, "exception": exception}
    )
    return value or 0.0


def condition_of(c: Cluster, type_: str) -> dict[str, Any]:
    return next(x for x in c.body["status"]["conditions"] if x["type"] == type_)


def fail(*args: Any, **kwargs: Any) -> Any:
    raise ZeroDivisionError(SECRET_TEXT)


async def fail_async(*args: Any, **kwargs: Any) -> Any:
    raise ZeroDivisionError(SECRET_TEXT)


# (step, where the exception is raised, the condition it ends in, the Warning Event of that transition)
STEP_FAILURES: list[tuple[str, Callable[[pytest.MonkeyPatch], None], str, str]] = [
    ("spec", lambda m: m.setattr(reconcile, "parse_spec", fail), "Fetched", "FetchFailed"),
    ("download", lambda m: m.setattr(download.Downloader, "_download", fail_async), "Fetched", "FetchFailed"),
    ("ownership", lambda m: m.setattr(RayServiceWriter, "owned_live", fail_async), "Applied", "ApplyFailed"),
    ("rollout", lambda m: m.setattr(progress.Rollouts, "plan", fail_async), "Applied", "ApplyFailed"),
    ("render", lambda m: m.setattr(rendering, "render_rayservice", fail), "Applied", "ApplyFailed"),
    ("apply", lambda m: m.setattr(writer, "predict", fail), "Applied", "ApplyFailed"),
]


@pytest.mark.parametrize(("step", "break_it", "type_", "warning"), STEP_FAILURES, ids=[s[0] for s in STEP_FAILURES])
async def test_an_unexpected_exception_in_any_step_is_a_condition_an_event_and_a_metric(
    step: str, break_it: Callable[[pytest.MonkeyPatch], None], type_: str, warning: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = Cluster()
    break_it(monkeypatch)
    c.watch_servegraph()
    with pytest.raises(RetryLater):
        await c.reconcile()
    cond = condition_of(c, type_)
    assert (cond["status"], cond["reason"]) == ("False", "InternalError")
    assert "ZeroDivisionError" in cond["message"] and unexpected.STEPS[step][1] in cond["message"]
    warnings = [(r, m) for t, r, m in c.api.events if t == "Warning" and "InternalError" in m]
    assert warnings == [(warning, f"InternalError: {cond['message']}")]
    assert TOKEN not in str(c.body["status"]) and TOKEN not in str(c.api.events)
    assert internal_errors(c, step, "ZeroDivisionError") == 1
    assert "apply_rayservice" not in c.api.calls

    c.watch_servegraph()  # the retry (when it is due): the same failure is counted, not said again
    memory = c.reconciler.cache.memory(KEY)
    if memory.fetch.retry_at:  # a failed download's retry, due now
        memory.fetch = replace(memory.fetch, retry_at=time.monotonic() - 1)
    c.api.events.clear()
    with pytest.raises(RetryLater):
        await c.reconcile()
    assert [e for e in c.api.events if e[0] == "Warning"] == []
    assert internal_errors(c, step, "ZeroDivisionError") == 2


async def test_an_exception_while_writing_the_status_is_an_event_and_a_metric(monkeypatch: pytest.MonkeyPatch) -> None:
    c = Cluster()
    monkeypatch.setattr(reconcile, "report", fail)
    c.watch_servegraph()
    with pytest.raises(RetryLater):
        await c.reconcile()
    assert c.api.events == [
        (
            "Warning",
            "InternalError",
            "unexpected ZeroDivisionError while writing the status; the operator's log has the details",
        )
    ]
    assert internal_errors(c, "status", "ZeroDivisionError") == 1


async def test_a_failing_step_is_retried_with_a_growing_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the real worker and work queue: each retry waits about twice as long as the one before."""
    c = Cluster()
    c.queue = WorkQueue(base_delay_s=0.05)
    c.reconciler = Reconciler(c.api, c.registry, c.reconciler.metrics, c.queue)
    calls: list[float] = []
    fourth = asyncio.Event()

    def failing_render(*args: Any, **kwargs: Any) -> Any:
        calls.append(time.monotonic())
        if len(calls) == 4:
            fourth.set()
        raise ZeroDivisionError(SECRET_TEXT)

    monkeypatch.setattr(rendering, "render_rayservice", failing_render)
    c.watch_servegraph()
    worker = asyncio.create_task(run_worker(c.reconciler, c.queue))
    try:
        await asyncio.wait_for(fourth.wait(), timeout=10)
    finally:
        worker.cancel()
    gaps = [b - a for a, b in itertools.pairwise(calls)]
    # base 0.05 s doubled per failure, jittered by ±20%: 0.04-0.06, 0.08-0.12, 0.16-0.24 s
    assert gaps[0] < gaps[1] < gaps[2], gaps
    assert gaps[2] >= 0.15, gaps
    assert condition_of(c, "Applied")["reason"] == "InternalError"
    assert internal_errors(c, "render", "ZeroDivisionError") == 4


# -- quantities Kubernetes accepts, end to end -----------------------------------------------------


async def test_a_head_memory_of_2e9_is_applied_and_upgraded() -> None:
    """`2e9` is a valid Kubernetes quantity: the prediction before each apply must read it."""
    c = Cluster()
    c.body["spec"]["rayService"] = {"head": {"resources": {"requests": {"memory": "2e9"}}}}
    await c.started()
    assert c.condition("Applied") == ("True", "UpToDate")
    head = c.api.rayservices[KEY]["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    assert head["containers"][0]["resources"]["requests"]["memory"] == "2e9"

    c.body["spec"]["rayService"]["image"] = "example.com/ray:2"  # the cluster changes: a new one is predicted
    c.body["metadata"]["generation"] = 2
    c.watch_servegraph()
    await c.reconcile()
    assert c.condition("Applied") == ("True", "UpToDate")
    (upgrade,) = [m for t, r, m in c.api.events if r == "NewClusterUpgrade"]
    # The head's 2e9 bytes (1.86 GiB) plus the worker's request: the peak is counted, not refused.
    assert "starts a new Ray cluster" in upgrade and "GiB" in upgrade


# -- a RayService too large for the API server -------------------------------------------------------


def oversized_graph() -> bytes:
    """mini with 1.5 MB of user_config: a valid graph whose RayService cannot be stored."""
    g = graph_pb2.Graph.FromString(MINI)
    node = next(iter(g.applications[0].nodes.values()))
    node.user_config.update({f"pad{i}": "x" * 60_000 for i in range(25)})
    return g.SerializeToString()


async def test_a_rayservice_too_large_to_store_is_refused_before_any_apply_and_not_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    c = Cluster()
    await c.started()
    applied = dict(c.api.rayservices[KEY])
    renders: list[int] = []
    real_render = render_rayservice

    def counted(*args: Any) -> dict[str, Any]:
        renders.append(1)
        return real_render(*args)

    monkeypatch.setattr(rendering, "render_rayservice", counted)

    c.publish(oversized_graph())
    await c.reconcile()  # no RetryLater: trying again cannot help (the rollout's deadline still runs)
    cond = condition_of(c, "Applied")
    assert (cond["status"], cond["reason"]) == ("False", "RenderTooLarge")
    assert f"{MAX_RAYSERVICE_BYTES:,} bytes" in cond["message"] and f"RayService {NAME} is 1,5" in cond["message"]
    assert "apply_rayservice" not in c.api.calls and "get_rayservice" not in c.api.calls
    assert c.api.rayservices[KEY] == applied, "the running RayService stays as it is"
    assert ("Warning", "ApplyFailed") in [(t, r) for t, r, _ in c.api.events]

    c.api.calls.clear()
    c.api.events.clear()
    c.watch_servegraph()  # the status write comes back through the watch: nothing is tried again
    await c.reconcile()
    assert c.api.writes() == [] and len(renders) == 1

    c.publish(MINI)  # a new version is the next attempt
    await c.reconcile()
    assert c.condition("Applied") == ("True", "UpToDate")


def test_the_limit_is_inclusive_and_the_refusal_names_size_and_limit() -> None:
    assert too_large("g", MAX_RAYSERVICE_BYTES) is None
    refused = too_large("g", MAX_RAYSERVICE_BYTES + 1)
    assert refused is not None and (refused.type, refused.status, refused.reason) == (
        "Applied",
        False,
        "RenderTooLarge",
    )
    assert "1,468,007 bytes" in refused.message and "1,468,006 bytes" in refused.message
    assert MAX_RAYSERVICE_BYTES < 1.5 * 1024 * 1024  # below etcd's default request limit
