"""`servegraph run --context` on the real API server: kopf's watches and the operator's own
client both use the named context, not the kubeconfig's current one (here a dead server)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sg_support import OPERATOR_USER, Kit, bind_operator_rbac, read_log, sample_bytes, start_operator
from support import REGISTRY_TOKEN

from servegraph_testbed import ControlPlane
from servegraph_testbed.registry import RegistryServer


def _two_contexts(cp: ControlPlane, path: Path) -> str:
    """The operator's kubeconfig with a second context, current, whose server answers nothing;
    returns the name of the real one."""
    doc = yaml.safe_load(cp.kubeconfig(OPERATOR_USER).read_text())
    real = doc["current-context"]
    context = next(c for c in doc["contexts"] if c["name"] == real)["context"]
    cluster = next(c for c in doc["clusters"] if c["name"] == context["cluster"])["cluster"]
    doc["clusters"].append({"name": "dead", "cluster": {**cluster, "server": "https://127.0.0.1:1"}})
    doc["contexts"].append({"name": "nowhere", "context": {**context, "cluster": "dead"}})
    doc["current-context"] = "nowhere"
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return str(real)


@pytest.fixture
async def kit(admin_api: Any, namespace: str, registry: RegistryServer, ca_pem: str) -> AsyncIterator[Kit]:
    k = Kit(admin_api, namespace, registry, ca_pem)
    await k.secret("registry-token", {"token": REGISTRY_TOKEN})
    await k.secret("registry-ca", {"ca.crt": ca_pem})
    yield k


async def test_the_operator_runs_at_the_named_context(control_plane: ControlPlane, kit: Kit, tmp_path: Path) -> None:
    bind_operator_rbac(control_plane)
    kubeconfig = tmp_path / "kubeconfig"
    real = _two_contexts(control_plane, kubeconfig)
    component, _ = start_operator(
        control_plane, "servegraph-operator-context", "--kubeconfig", str(kubeconfig), "--context", real,
        "-n", kit.namespace,
    )  # fmt: skip
    try:
        kit.registry.registry.publish(f"{kit.namespace}-g", sample_bytes("mini"))
        await kit.servegraph("g", f"{kit.namespace}-g")
        await kit.wait_condition("g", "Applied", "True")
        assert await kit.get_rs("g") is not None
    finally:
        control_plane.unspawn(component)
    log = read_log(component.log_path)
    assert "127.0.0.1:1" not in log, "something used the kubeconfig's current context"
