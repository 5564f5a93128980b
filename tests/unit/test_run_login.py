"""`servegraph run --context`: kopf's credentials read at that context of the kubeconfig, as
the operator's own API client reads them (on the real API server: tests/integration/test_run_context.py)."""

from __future__ import annotations

import base64
from pathlib import Path

import kopf
import pytest
import yaml
from cli_support import run_cli

from servegraph.operator.run import login

CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()


def kubeconfig(tmp_path: Path) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "nowhere",
        "clusters": [
            {"name": "dead", "cluster": {"server": "https://127.0.0.1:1"}},
            {"name": "real", "cluster": {"server": "https://10.0.0.1:6443", "certificate-authority-data": CA}},
        ],
        "users": [{"name": "nobody", "user": {}}, {"name": "operator", "user": {"token": "t0ken"}}],
        "contexts": [
            {"name": "nowhere", "context": {"cluster": "dead", "user": "nobody"}},
            {"name": "prod", "context": {"cluster": "real", "user": "operator", "namespace": "team-a"}},
        ],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


async def test_the_named_context_not_the_current_one(tmp_path: Path) -> None:
    info = await login.at_context(str(kubeconfig(tmp_path)), "prod")
    assert (info.server, info.token, info.insecure) == ("https://10.0.0.1:6443", "t0ken", False)
    assert info.ca_path is not None
    assert _text(info.ca_path).startswith("-----BEGIN CERTIFICATE-----"), "the inline CA, written to a file"


def _text(path: str) -> str:
    return Path(path).read_text()


async def test_a_context_the_kubeconfig_lacks_is_a_login_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(kopf.LoginError, match="context 'staging'"):
        await login.at_context(str(kubeconfig(tmp_path)), "staging")


def test_run_refuses_a_missing_context_in_one_line_before_starting(tmp_path: Path) -> None:
    done = run_cli("run", "--kubeconfig", str(kubeconfig(tmp_path)), "--context", "staging", home=tmp_path)
    assert done.returncode == 3, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("servegraph run: kubeconfig ") and "'staging'" in line
