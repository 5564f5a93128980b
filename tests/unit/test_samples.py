"""The shipped samples validate, render, and pass Ray's and KubeRay's own schemas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from ray.serve.schema import ServeDeploySchema
from support import SAMPLES

from servegraph.graph import Format, decode, encode, load_graph
from servegraph.operator.fetch.parsing import GraphParser, parse_here
from servegraph.render import RayServiceOptions, render_rayservice, render_serve_config, serve_config_yaml

NAMES = ["mini", "heterogeneous", "complete", "observed", "streaming"]


@pytest.fixture(scope="module")
def rayservice_schema(kuberay_crds: Path) -> dict[str, Any]:
    crd = yaml.safe_load((kuberay_crds / "ray.io_rayservices.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return _closed(schema)


def _closed(schema: dict[str, Any]) -> dict[str, Any]:
    """Forbid fields the CRD does not declare: the API server would silently prune
    them, so a misspelt field would otherwise pass here and vanish there."""
    out = dict(schema)
    if "properties" in out and not out.get("x-kubernetes-preserve-unknown-fields"):
        out["properties"] = {k: _closed(v) for k, v in out["properties"].items()}
        out.setdefault("additionalProperties", False)
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = _closed(out[key])
    return out


@pytest.mark.parametrize("name", NAMES)
def test_packed_sample_matches_its_text(name: str) -> None:
    text = decode((SAMPLES / f"{name}.txtpb").read_bytes(), Format.TEXT)
    assert (SAMPLES / f"{name}.pb").read_bytes() == encode(text), (
        f"run: servegraph pack config/samples/{name}.txtpb --output config/samples/{name}.pb"
    )


@pytest.mark.parametrize("name", NAMES)
def test_serve_config_passes_ray_schema(name: str) -> None:
    config = render_serve_config(load_graph(SAMPLES / f"{name}.pb"))
    parsed = ServeDeploySchema.model_validate(config)
    assert [a.name for a in parsed.applications] == [a["name"] for a in config["applications"]]
    assert all(a.import_path == "servegraph.runtime:build" for a in parsed.applications)


@pytest.mark.parametrize("name", NAMES)
def test_rayservice_passes_kuberay_crd_schema(name: str, rayservice_schema: dict[str, Any]) -> None:
    graph = load_graph(SAMPLES / f"{name}.pb")
    manifest = render_rayservice(graph, RayServiceOptions(name=name, namespace="ns"))
    jsonschema.Draft7Validator(rayservice_schema).validate(manifest)
    assert yaml.safe_load(manifest["spec"]["serveConfigV2"]) == render_serve_config(graph)


@pytest.mark.parametrize("path", [("minReplicas", "one"), ("rayStartParam", {})])
def test_crd_schema_check_can_fail(rayservice_schema: dict[str, Any], path: tuple[str, Any]) -> None:
    manifest = render_rayservice(load_graph(SAMPLES / "mini.pb"), RayServiceOptions(name="mini"))
    manifest["spec"]["rayClusterConfig"]["workerGroupSpecs"][0][path[0]] = path[1]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(rayservice_schema).validate(manifest)


@pytest.mark.parametrize("name", NAMES)
def test_text_and_binary_render_the_same(name: str) -> None:
    assert serve_config_yaml(load_graph(SAMPLES / f"{name}.txtpb")) == serve_config_yaml(
        load_graph(SAMPLES / f"{name}.pb")
    )


async def test_the_operator_child_process_parse_keeps_every_field_of_the_samples() -> None:
    """The operator parses in a spawned child and gets the model back pickled: the model
    must arrive whole (telemetry once did not, and routers stopped forwarding headers)."""
    parser = GraphParser()
    parsed = {}
    try:
        for name in NAMES:
            data = (SAMPLES / f"{name}.pb").read_bytes()
            parsed[name] = await parser.parse(data, max_bytes=len(data))
            assert parsed[name] == await parse_here(data, max_bytes=len(data)), name
    finally:
        await parser.close()
    assert parsed["observed"].applications[0].telemetry.forward_headers  # so the comparison covers telemetry
