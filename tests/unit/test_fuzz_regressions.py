"""Inputs the fuzzer (fuzz/fuzz_graph.py) found breaking the parse/render contract,
minimized and kept here so each fix stays fixed."""

from __future__ import annotations

import time

import pytest
import yaml

from servegraph.graph import Format, GraphError, decode, encode, parse_graph
from servegraph.render import RayServiceOptions, render_rayservice, render_serve_config, serve_config_yaml


def _round_trips(text: str) -> None:
    graph = parse_graph(text.encode(), Format.TEXT)
    assert yaml.safe_load(serve_config_yaml(graph)) == render_serve_config(graph)


def test_replicas_times_resources_overflowing_a_float_is_a_graph_error() -> None:
    """Was OverflowError from math.ceil(inf) while sizing worker groups (found as binary).

    Sizing is part of validation, so the graph is refused before anything renders it.
    """
    with pytest.raises(GraphError, match=r'worker group "cpu": .* too large'):
        parse_graph(
            b"""name: "g" schema_version: 1
            applications { name: "a" route_prefix: "/a" ingress: "n"
              nodes { key: "n" value {
                deployment { import_path: "m:C" }
                resources { num_cpus: 1.7e308 }
                scaling { num_replicas: 2 } } } }""",
            Format.TEXT,
        )


def test_one_huge_replica_still_renders() -> None:
    """The overflow check must not reject a large but countable demand."""
    graph = parse_graph(
        b"""name: "g" schema_version: 1
        applications { name: "a" route_prefix: "/a" ingress: "n"
          nodes { key: "n" value { deployment { import_path: "m:C" } resources { num_cpus: 1.7e308 } } } }""",
        Format.TEXT,
    )
    (group,) = render_rayservice(graph, RayServiceOptions(name="g"))["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert group["replicas"] == 1


@pytest.mark.parametrize(
    "field",
    [
        'route_prefix: "/a:"',  # was: ScannerError "mapping values are not allowed here"
        'route_prefix: "/a" runtime_env { pip: "torch:" }',  # was: read back as {"torch": None}
        'route_prefix: "/a" runtime_env { working_dir: "s3://b/k:" }',
    ],
)
def test_strings_ending_in_a_colon_are_quoted(field: str) -> None:
    _round_trips(
        f"""name: "g" schema_version: 1
        applications {{ name: "a" {field} ingress: "n"
          nodes {{ key: "n" value {{ deployment {{ import_path: "m:C" }} }} }} }}"""
    )


@pytest.mark.parametrize(
    ("kwarg", "config_key"),
    [("a" * 1100, "k"), ("a", "k" * 1100), ("a", "\x85" * 200)],
    ids=["long-kwarg", "long-user-config-key", "escaped-user-config-key"],
)
def test_long_struct_keys_survive_yaml(kwarg: str, config_key: str) -> None:
    """Was ParserError: YAML drops an implicit key over 1024 characters (found via JSON);
    the renderer escapes U+0085 to six characters, so 200 of them are over the limit too."""
    _round_trips(
        f"""name: "g" schema_version: 1
        applications {{ name: "a" route_prefix: "/a" ingress: "n"
          nodes {{ key: "n" value {{
            deployment {{ import_path: "m:C" kwargs {{ key: "{kwarg}" value {{ value {{ bool_value: true }} }} }} }}
            user_config {{ fields {{ key: "{config_key}" value {{ list_value {{ values {{ number_value: 1e16 }} }} }} }} }}
          }} }} }}"""
    )


def _nested(levels: int, fmt: Format) -> bytes:
    """A graph whose user_config is `levels` of {"k": [...]} around 1."""
    if fmt is Format.JSON:
        value = "1"
        for _ in range(levels):
            value = f'{{"k": [{value}]}}'
        return (
            '{"name": "g", "schemaVersion": 1, "applications": [{"name": "a", "routePrefix": "/a", "ingress": "n",'
            f' "nodes": {{"n": {{"deployment": {{"importPath": "m:C"}}, "userConfig": {{"k": {value}}}}}}}}}]}}'
        ).encode()
    value = "number_value: 1"
    for _ in range(levels):
        value = f'struct_value {{ fields {{ key: "k" value {{ list_value {{ values {{ {value} }} }} }} }} }}'
    return (
        'name: "g" schema_version: 1 applications { name: "a" route_prefix: "/a" ingress: "n" nodes { key: "n"'
        f' value {{ deployment {{ import_path: "m:C" }} user_config {{ fields {{ key: "k" value {{ {value} }} }} }} }} }} }}'
    ).encode()


@pytest.mark.parametrize("fmt", [Format.JSON, Format.TEXT])
def test_nesting_deeper_than_binary_allows_is_rejected(fmt: Format) -> None:
    """Was accepted as JSON (found so) and text though its binary encoding fails upb's depth
    limit, so `servegraph pack` turned a valid graph into one the operator rejects."""
    with pytest.raises(GraphError, match="nested too deeply"):
        parse_graph(_nested(21, fmt), fmt)


@pytest.mark.parametrize("fmt", [Format.JSON, Format.TEXT])
def test_nesting_within_the_binary_limit_is_accepted(fmt: Format) -> None:
    data = _nested(15, fmt)
    graph = parse_graph(data, fmt)
    assert parse_graph(encode(decode(data, fmt)), Format.BINARY) == graph


@pytest.mark.parametrize("path", ["a." * 32_000 + "!", "a" + ".a" * 32_000 + ": "])
def test_long_invalid_import_path_is_rejected_in_linear_time(path: str) -> None:
    """Was a hang: the import-path regex backtracked quadratically (about 20 s for these 64 KB,
    hours for a 16 MB graph), stalling the operator's reconcile."""
    graph = f"""name: "g" schema_version: 1
    applications {{ name: "a" route_prefix: "/a" ingress: "n"
      nodes {{ key: "n" value {{ deployment {{ import_path: "{path}" }} }} }} }}"""
    start = time.monotonic()
    with pytest.raises(GraphError, match=r"deployment\.import_path"):
        parse_graph(graph.encode(), Format.TEXT)
    assert time.monotonic() - start < 2
