"""`--pods` as a check to trust (issue 47, item 2): read as kubectl reads a file (several
documents, `kind: List`), the ServeGraphs picked and held to the CRD's schema, anything else
refused by name. Before, the samples were refused and a List, a typo or the CRD itself "fit"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from support import ROOT, SAMPLES

from servegraph.cli import schema
from servegraph.cli.main import main

MINI = str(SAMPLES / "mini.txtpb")
SOURCE = {"url": "https://registry.example/g", "tokenSecretRef": {"name": "token"}}


def servegraph(name: str, ray_service: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "servegraph.io/v1alpha1",
        "kind": "ServeGraph",
        "metadata": {"name": name},
        "spec": {"source": SOURCE, "rayService": ray_service},
    }


def write(tmp_path: Path, *docs: Any) -> Path:
    path = tmp_path / "pods.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


@pytest.mark.parametrize("name", ["mini", "heterogeneous", "complete", "observed", "streaming"])
def test_every_sample_manifest_is_read_with_its_secret(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Each sample is a Secret and a ServeGraph in one file, as `kubectl apply -f` takes it."""
    pods = SAMPLES / f"{name}.yaml"
    assert main(["validate", str(SAMPLES / f"{name}.pb"), "--pods", str(pods)]) == 0, capsys.readouterr().err
    assert f"fits the pods of ServeGraph {name} in {pods}" in capsys.readouterr().out


def test_a_list_around_a_servegraph_whose_workers_cannot_run_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = servegraph("tiny", {"workers": {"resources": {"limits": {"cpu": "100m", "memory": "1Mi"}}}})
    pods = write(tmp_path, {"apiVersion": "v1", "kind": "List", "items": [tiny]})
    assert main(["validate", MINI, "--pods", str(pods)]) == 2
    err = capsys.readouterr().err
    assert 'worker group "cpu": the worker pod set by the ServeGraph has 1Mi of memory, too little for Ray' in err
    assert "(in the pods of ServeGraph tiny)" in err


def test_a_misspelt_field_is_an_error_with_the_right_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pods = write(tmp_path, servegraph("typo", {"wrokers": {"resources": {"limits": {"cpu": "1"}}}}))
    assert main(["validate", MINI, "--pods", str(pods)]) == 2
    assert capsys.readouterr().err == (
        f"error: {pods}: ServeGraph typo, field spec.rayService.wrokers: unknown field; did you mean 'workers'?\n"
    )


@pytest.mark.parametrize(
    ("path", "holds"),
    [
        (
            ROOT / "config" / "crd" / "servegraph.io_servegraphs.yaml",
            "CustomResourceDefinition servegraphs.servegraph.io",
        ),
        (ROOT / "config" / "manager" / "manager.yaml", "Deployment servegraph-operator"),
    ],
    ids=["crd", "manager"],
)
def test_unrelated_yaml_is_refused_naming_what_it_holds(
    path: Path, holds: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["validate", MINI, "--pods", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"error: {path}: no ServeGraph (nor a spec.rayService section) in it: it holds {holds}\n"
    )


def test_each_servegraph_of_a_file_is_checked_and_render_takes_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    roomy = servegraph("roomy", {"workers": {"resources": {"limits": {"cpu": "2", "memory": "4Gi"}}}})
    small = servegraph("small", {"workers": {"resources": {"limits": {"cpu": "1", "memory": "2Gi"}}}})
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "token"}, "stringData": {"token": "x"}}
    pods = write(tmp_path, secret, roomy, small)
    assert main(["validate", MINI, "--pods", str(pods)]) == 0
    assert "fits the pods of ServeGraph roomy, ServeGraph small in" in capsys.readouterr().out
    assert main(["render", MINI, "--pods", str(pods)]) == 2
    assert "holds 2 ServeGraphs (ServeGraph roomy, ServeGraph small); render takes one" in capsys.readouterr().err


def test_a_wrong_api_version_and_a_missing_source_are_the_crds_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = {**servegraph("old", {}), "apiVersion": "servegraph.io/v1"}
    assert main(["validate", MINI, "--pods", str(write(tmp_path, old))]) == 2
    assert "apiVersion 'servegraph.io/v1'; this servegraph reads servegraph.io/v1alpha1" in capsys.readouterr().err
    bare = servegraph("bare", {})
    del bare["spec"]["source"]
    assert main(["validate", MINI, "--pods", str(write(tmp_path, bare))]) == 2
    assert "ServeGraph bare, field spec.source: required" in capsys.readouterr().err


# ---- the schema check itself -------------------------------------------------------------


def test_the_shipped_crd_is_config_crd() -> None:
    """The wheel carries the CRD for --pods; it must be the one source of truth, byte for byte."""
    shipped = ROOT / "src" / "servegraph" / "cli" / schema.CRD_FILE
    assert shipped.read_bytes() == (ROOT / "config" / "crd" / schema.CRD_FILE).read_bytes(), (
        f"run: cp config/crd/{schema.CRD_FILE} src/servegraph/cli/"
    )


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"source": {**SOURCE, "maxBytes": 0}}, "field spec.source.maxBytes: 0 is below the minimum 1"),
        ({"source": {**SOURCE, "sha256": "xyz"}}, "field spec.source.sha256: 'xyz' does not match"),
        ({"source": SOURCE, "rayService": {"upgradeStrategy": "Rolling"}}, "'Rolling' is not one of 'NewCluster'"),
        (
            {"source": SOURCE, "rollout": {"historyLimit": True}},
            "field spec.rollout.historyLimit: True is not an integer",
        ),
        ({"source": SOURCE, "rayService": {"name": "x" * 48}}, "48 characters, over the limit of 47"),
        (
            {"source": SOURCE, "rayService": {"rayClusterDeletionDelaySeconds": -1}},
            "field spec.rayService.rayClusterDeletionDelaySeconds: -1 is below the minimum 0",
        ),
        (
            {"source": SOURCE, "rayService": {"head": {"resources": {"limits": {"cpu": 1.5}}}}},
            "is not integer or string",
        ),
    ],
)
def test_the_schema_check_finds_what_the_api_server_would(spec: dict[str, Any], problem: str) -> None:
    body = {"apiVersion": "servegraph.io/v1alpha1", "kind": "ServeGraph", "spec": spec}
    found = schema.check(body, schema.servegraph_schema(), "")
    assert any(problem in p for p in found), found


def test_the_schema_check_passes_the_samples() -> None:
    for path in sorted(SAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "ServeGraph":
                body = {k: v for k, v in doc.items() if k != "metadata"}
                assert schema.check(body, schema.servegraph_schema(), "") == [], path
