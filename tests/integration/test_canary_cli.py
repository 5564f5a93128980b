"""A ServeGraph's canary against the real API server: the CRD's rules for spec.rollout.canary
(CEL, checked by the server on a dry run: nothing is stored) and `servegraph promote|abort
NAME`, the annotation it sets, for whom and when.

No operator runs here: what the operator does with the annotation is
tests/unit/test_reconcile_canary.py (promote by hand) and what a canary does to real
requests is tests/node/test_canary.py. The canary state the CLI reads is put in the status
subresource by the admin, as the operator would have written it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio.client.rest import ApiException
from sg_support import Kit
from support import REGISTRY_TOKEN

from servegraph.names import CANARY_ANNOTATION
from servegraph_testbed import ControlPlane
from servegraph_testbed.registry import RegistryServer

GROUP, VERSION, PLURAL = "servegraph.io", "v1alpha1", "servegraphs"
STEPS = [{"weight": 10, "pause": "1m"}, {"weight": 50, "pause": "1m"}]


@pytest.fixture
async def kit(admin_api: Any, namespace: str, registry: RegistryServer, ca_pem: str) -> AsyncIterator[Kit]:
    k = Kit(admin_api, namespace, registry, ca_pem)
    await k.secret("registry-token", {"token": REGISTRY_TOKEN})
    yield k


def _body(kit: Kit, name: str, canary: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ServeGraph",
        "metadata": {"name": name},
        "spec": {
            "source": {"url": kit.registry.url("g"), "tokenSecretRef": {"name": "registry-token"}},
            "rollout": {"canary": canary},
        },
    }


async def _dry_run(kit: Kit, canary: dict[str, Any]) -> str:
    """The server's answer to creating a ServeGraph with this canary: "" when taken."""
    try:
        await kit.custom.create_namespaced_custom_object(
            GROUP, VERSION, kit.namespace, PLURAL, _body(kit, "dry", canary), dry_run="All"
        )
    except ApiException as exc:
        assert exc.status == 422, exc
        return str(exc.body)
    return ""


@pytest.mark.parametrize(
    ("canary", "says"),
    [
        ({"steps": [{"weight": 100}]}, "each weight must be between 1 and 99"),
        ({"steps": [{"weight": 0}]}, "each weight must be between 1 and 99"),
        ({"steps": [{"weight": 50}, {"weight": 10}]}, "weights must rise from each step to the next"),
        ({"steps": [{"weight": 10}, {"weight": 10}]}, "weights must rise from each step to the next"),
        ({"steps": STEPS, "stickyKey": {"header": "x-user", "field": "user"}}, "set exactly one of header and field"),
        ({"steps": STEPS, "stickyKey": {}}, "set exactly one of header and field"),
        ({"steps": []}, "a canary needs a step or a mirror"),
        ({"steps": [], "mirror": {"percent": 0}}, "a canary needs a step or a mirror"),
        ({"steps": STEPS, "onPublish": "Later"}, "onPublish"),
        ({"steps": STEPS, "analysis": {"maxErrorRate": 2}}, "maxErrorRate"),
    ],
)
async def test_the_crd_refuses_a_canary_that_cannot_run(kit: Kit, canary: dict[str, Any], says: str) -> None:
    answer = await _dry_run(kit, canary)
    assert says in answer, answer


async def test_the_crd_takes_a_whole_canary_and_fills_its_defaults(kit: Kit) -> None:
    canary = {
        "steps": STEPS,
        "analysis": {"nodes": [{"application": "review", "node": "sentiment", "maxErrorRate": 0.001}]},
        "mirror": {"percent": 20},
        "stickyKey": {"header": "x-user-id"},
        "onPublish": "Queue",
    }
    assert await _dry_run(kit, canary) == ""
    assert await _dry_run(kit, {"steps": [], "mirror": {"percent": 20}}) == "", "a mirror alone is a canary"
    assert await _dry_run(kit, {}) == "", "`canary: {}` is a canary with the safe defaults"
    created = await kit.custom.create_namespaced_custom_object(
        GROUP, VERSION, kit.namespace, PLURAL, _body(kit, "whole", canary)
    )
    stored = created["spec"]["rollout"]["canary"]
    assert stored["analysis"] | {"nodes": []} == {
        "interval": "15s",
        "minRequests": 20,
        "maxErrorRate": 0.01,
        "maxLatencyRatio": 2,
        "failureLimit": 1,
        "nodes": [],
    }
    assert stored["mirror"] == {"percent": 20, "pause": "1m"}


async def _in_canary(kit: Kit, name: str, phase: str) -> dict[str, Any]:
    """A ServeGraph whose status says a canary is at `phase` (as the operator writes it)."""
    created = await kit.custom.create_namespaced_custom_object(
        GROUP, VERSION, kit.namespace, PLURAL, _body(kit, name, {"steps": STEPS})
    )
    status = {"rollout": {"version": "2", "digest": "a" * 64, "phase": "Progressing", "canary": {"phase": phase}}}
    await kit.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, kit.namespace, PLURAL, name, {"status": status}, _content_type="application/merge-patch+json"
    )
    return dict(created)


def _cli(cp: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servegraph.cli", *args, "--kubeconfig", str(cp.kubeconfig("admin"))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def _annotation(kit: Kit, name: str) -> str | None:
    sg = await kit.get_sg(name)
    return (sg["metadata"].get("annotations") or {}).get(CANARY_ANNOTATION)


async def test_promote_and_abort_set_the_annotation_once_a_canary_runs(kit: Kit, control_plane: ControlPlane) -> None:
    await _in_canary(kit, "weighted", "Weighted")
    dry = await asyncio.to_thread(_cli, control_plane, "promote", "weighted", "-n", kit.namespace, "--dry-run=server")
    assert dry.returncode == 0, dry.stderr
    assert await _annotation(kit, "weighted") is None, "a dry run wrote the annotation"

    done = await asyncio.to_thread(_cli, control_plane, "promote", "weighted", "-n", kit.namespace)
    assert done.returncode == 0, done.stderr
    value = await _annotation(kit, "weighted")
    assert value is not None and value.startswith("promote@") and value in done.stdout

    again = await asyncio.to_thread(_cli, control_plane, "abort", "weighted", "-n", kit.namespace)
    assert again.returncode == 0, again.stderr
    later = await _annotation(kit, "weighted")
    assert later is not None and later.startswith("abort@"), "the newest ask replaces the annotation"


@pytest.mark.parametrize(("phase", "says"), [("Promoted", "its last canary is Promoted"), (None, "it has run none")])
async def test_promote_without_a_running_canary_is_refused_and_writes_nothing(
    kit: Kit, control_plane: ControlPlane, phase: str | None, says: str
) -> None:
    if phase is None:
        await kit.custom.create_namespaced_custom_object(
            GROUP, VERSION, kit.namespace, PLURAL, _body(kit, "ended", {"steps": STEPS})
        )
    else:
        await _in_canary(kit, "ended", phase)
    done = await asyncio.to_thread(_cli, control_plane, "promote", "ended", "-n", kit.namespace)
    assert done.returncode == 2, (done.returncode, done.stderr)
    (line,) = done.stderr.strip().splitlines()
    assert f"ServeGraph {kit.namespace}/ended: no canary runs ({says})" in line
    assert await _annotation(kit, "ended") is None

    missing = await asyncio.to_thread(_cli, control_plane, "abort", "missing", "-n", kit.namespace)
    assert missing.returncode == 2 and "not found" in missing.stderr, missing.stderr
