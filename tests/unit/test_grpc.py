"""gRPC for every graph: an application's servicer functions are checked, the renderer
serves GraphService beside them on a `serve-grpc` port, `servegraph up` says how to call."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from builders import chain_app, graph
from ray.serve.schema import ServeDeploySchema
from support import SAMPLES

from servegraph.cli import deploy as command
from servegraph.dag import model
from servegraph.graph import GraphError, load_graph
from servegraph.graph.errors import Problem
from servegraph.graph.servicers import GRAPH_SERVICE_SERVICER, MAX_LENGTH, MAX_SERVICERS, servicer_functions
from servegraph.graph.validate import to_model
from servegraph.names import GRPC_SERVICERS_ANNOTATION
from servegraph.raydash.dashboard import ServeState, parse_serve_details
from servegraph.raydash.up import graph_service_apps, grpc_line, render
from servegraph.render import RayServiceOptions, render_rayservice, render_serve_config, serve_config_yaml
from servegraph.render.serve_config import SERVE_GRPC_PORT, SERVE_HTTP_PORT
from servegraph.render.upgrade import predict

DATA = Path(__file__).parent / "data"
OWN = "reviews.v1.reviews_pb2_grpc.add_ReviewsServicer_to_server"


def _with_servicers(*entries: str, name: str = "app") -> Any:
    app = chain_app(name)
    app.grpc_servicer_functions.extend(entries)
    return app


def _problems(*entries: str) -> list[str]:
    with pytest.raises(GraphError) as raised:
        to_model(graph(_with_servicers(*entries)))
    return [str(p) for p in raised.value.problems]


# ---- the graph: Application.grpc_servicer_functions ---------------------------------


def test_an_applications_servicer_functions_reach_the_model_in_order() -> None:
    other = "b_pkg.api_pb2_grpc.add_ApiServicer_to_server"
    (app,) = to_model(graph(_with_servicers(OWN, other))).applications
    assert app.grpc_servicer_functions == (OWN, other)
    (plain,) = to_model(graph(chain_app())).applications
    assert plain.grpc_servicer_functions == ()


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("add_ReviewsServicer_to_server", "is not a Python import path of a function (module.function"),
        ("reviews_pb2_grpc:add_ReviewsServicer_to_server", "write it dotted (module.function)"),
        ("reviews pb2.add", "is not a Python import path"),
        ("reviews..add", "is not a Python import path"),
        ("reviews.add.", "is not a Python import path"),
        ("1reviews.add", "is not a Python import path"),
        ("", "is not a Python import path"),
        (GRAPH_SERVICE_SERVICER, "is always served (servegraph's GraphService); remove it"),
    ],
)
def test_a_bad_servicer_function_is_named_by_application_and_entry(entry: str, says: str) -> None:
    (problem,) = _problems(OWN, entry)
    assert problem.startswith('application "app", field grpc_servicer_functions[1]: '), problem
    assert says in problem


def test_a_servicer_function_listed_twice_is_refused() -> None:
    assert _problems(OWN, OWN) == [
        f"application \"app\", field grpc_servicer_functions[1]: '{OWN}' is listed twice",
    ]


def test_servicer_functions_are_bounded_in_length_and_count() -> None:
    (long,) = _problems("a." + "b" * MAX_LENGTH)
    assert long == (
        f'application "app", field grpc_servicer_functions[0]: an import path over the limit of {MAX_LENGTH} characters'
    )
    assert "bbbb" not in long  # the entry itself is not echoed back
    many = [f"m{i}.pb2_grpc.add_S{i}Servicer_to_server" for i in range(MAX_SERVICERS + 1)]
    assert _problems(*many) == [
        f'application "app", field grpc_servicer_functions: {MAX_SERVICERS + 1} entries, '
        f"over the limit of {MAX_SERVICERS}"
    ]


def test_the_check_reports_every_bad_entry_at_once() -> None:
    found: list[Problem] = []
    kept = servicer_functions("a", ["x.y", "x", "x.y", "p.q"], found.append)
    assert kept == ("x.y", "p.q")
    assert [p.path for p in found] == [
        'application "a", field grpc_servicer_functions[1]',
        'application "a", field grpc_servicer_functions[2]',
    ]


# ---- the renderer: grpc_options and the serve-grpc port -----------------------------


def _two_apps(first: tuple[str, ...], second: tuple[str, ...]) -> model.Graph:
    return to_model(graph(_with_servicers(*first, name="one"), _with_servicers(*second, name="two")))


def test_grpc_options_serve_graphservice_first_then_every_applications_own() -> None:
    config = render_serve_config(_two_apps(("z.pb2_grpc.add_Z", OWN), ("a.pb2_grpc.add_A", OWN)))
    assert config["grpc_options"] == {
        "port": SERVE_GRPC_PORT,
        "grpc_servicer_functions": [GRAPH_SERVICE_SERVICER, "a.pb2_grpc.add_A", OWN, "z.pb2_grpc.add_Z"],
    }
    assert list(config) == ["proxy_location", "http_options", "grpc_options", "applications"]


def test_grpc_options_do_not_depend_on_the_order_of_applications() -> None:
    forward = render_serve_config(_two_apps(("z.m.add_Z",), ("a.m.add_A",)))["grpc_options"]
    g = graph(_with_servicers("a.m.add_A", name="two"), _with_servicers("z.m.add_Z", name="one"))
    assert render_serve_config(to_model(g))["grpc_options"] == forward


def test_every_graph_serves_graphservice_on_port_9000() -> None:
    text = serve_config_yaml(load_graph(SAMPLES / "mini.txtpb"))
    config = yaml.safe_load(text)
    assert config["grpc_options"] == {"port": 9000, "grpc_servicer_functions": [GRAPH_SERVICE_SERVICER]}
    assert "grpc_options:\n  port: 9000\n  grpc_servicer_functions:\n" in text  # one line each, stable
    ServeDeploySchema.model_validate(config)  # Ray's own schema takes it


def test_the_ports_can_be_moved_for_servegraph_up() -> None:
    config = render_serve_config(load_graph(SAMPLES / "mini.txtpb"), http_port=18000, grpc_port=19000)
    assert config["http_options"]["port"] == 18000
    assert config["grpc_options"]["port"] == 19000
    default = render_serve_config(load_graph(SAMPLES / "mini.txtpb"))
    assert (default["http_options"]["port"], default["grpc_options"]["port"]) == (SERVE_HTTP_PORT, SERVE_GRPC_PORT)


def test_the_graphservice_servicer_function_exists() -> None:
    from servegraph.v1 import service_pb2_grpc

    module, _, name = GRAPH_SERVICE_SERVICER.rpartition(".")
    assert module == service_pb2_grpc.__name__
    assert callable(getattr(service_pb2_grpc, name))


def test_the_head_exposes_serve_grpc_for_kuberays_serve_service() -> None:
    manifest = render_rayservice(load_graph(SAMPLES / "mini.txtpb"), RayServiceOptions(name="m"))
    head = manifest["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in head["ports"]}
    assert ports["serve"] == SERVE_HTTP_PORT
    assert ports["serve-grpc"] == SERVE_GRPC_PORT
    # KubeRay v1.6 puts "serve" and every "serve-*" port into the serve Service.
    assert sorted(n for n in ports if n == "serve" or n.startswith("serve-")) == ["serve", "serve-grpc"]
    config = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    assert config["grpc_options"]["port"] == ports["serve-grpc"]


def _head_annotations(g: model.Graph) -> dict[str, str]:
    manifest = render_rayservice(g, RayServiceOptions(name="x"))
    head = manifest["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]
    return dict((head.get("metadata") or {}).get("annotations") or {})


def test_a_change_of_own_servicers_builds_a_new_cluster() -> None:
    """Serve reads gRPC options only when it starts: serveConfigV2 alone would be ignored."""
    plain = to_model(graph(chain_app()))
    other_plain = to_model(graph(chain_app(name="other", length=3)))
    # Every head carries it (dropping the last template annotation under server-side apply
    # leaves `metadata: null`, which the CRD refuses), the same for every graph without servicers.
    assert (
        _head_annotations(plain)[GRPC_SERVICERS_ANNOTATION] == _head_annotations(other_plain)[GRPC_SERVICERS_ANNOTATION]
    )
    assert _head_annotations(plain) != _head_annotations(_two_apps((OWN,), ()))
    one = _two_apps((OWN,), ())
    two = _two_apps((OWN,), ("a.m.add_A",))
    assert _head_annotations(one)[GRPC_SERVICERS_ANNOTATION] != _head_annotations(two)[GRPC_SERVICERS_ANNOTATION]
    swapped = to_model(graph(_with_servicers("a.m.add_A", name="two"), _with_servicers(OWN, name="one")))
    assert _head_annotations(swapped) == _head_annotations(two)
    workers = render_rayservice(two, RayServiceOptions(name="x"))["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    assert all(GRPC_SERVICERS_ANNOTATION not in str(w) for w in workers)

    options = RayServiceOptions(name="x")
    before, after = render_rayservice(one, options), render_rayservice(two, options)
    assert predict(before, after).new_cluster
    assert not predict(before, render_rayservice(one, options)).new_cluster


# ---- servegraph up: the ports and the gRPC line --------------------------------------


def test_up_sends_the_ports_it_is_given() -> None:
    text, config = render(SAMPLES / "mini.txtpb", http_port=18000, grpc_port=19000)
    assert config == yaml.safe_load(text)
    assert (config["http_options"]["port"], config["grpc_options"]["port"]) == (18000, 19000)


def test_up_command_defaults_are_the_renderers_ports() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    command.add_arguments(parser.add_subparsers())
    args = parser.parse_args(["up", "g.txtpb"])
    assert (args.http_port, args.grpc_port) == (SERVE_HTTP_PORT, SERVE_GRPC_PORT)
    assert parser.parse_args(["up", "g.txtpb", "--grpc-port", "19001"]).grpc_port == 19001


def test_servegraph_up_reads_serves_grpc_options() -> None:
    state = parse_serve_details(json.loads((DATA / "ray-2.60-serve-applications.json").read_text()))
    assert (state.grpc_port, state.grpc_servicer_functions) == (9000, ())


def test_every_application_is_offered_for_graphservice_routed_ones_first() -> None:
    assert graph_service_apps(load_graph(SAMPLES / "mini.txtpb")) == ["sentiment"]  # a class at the ingress
    assert graph_service_apps(load_graph(SAMPLES / "observed.txtpb")) == [
        a.name for a in load_graph(SAMPLES / "observed.txtpb").applications
    ]


def test_the_grpc_line_is_the_call_command_or_why_there_is_none() -> None:
    serving = ServeState({}, None, 8000, grpc_port=9000, grpc_servicer_functions=(GRAPH_SERVICE_SERVICER,))
    assert (
        grpc_line(serving, ["sentiment"], "http://127.0.0.1:8265")
        == "gRPC: servegraph call --grpc 127.0.0.1:9000 --app sentiment PAYLOAD_JSON"
    )
    assert "--grpc [::1]:9000" in grpc_line(serving, ["a"], "http://[::1]:8265")
    assert grpc_line(serving, [], "http://127.0.0.1:8265") == "gRPC: the graph has no application to call"
    started_without = ServeState({}, None, 8000, grpc_port=9000, grpc_servicer_functions=())
    line = grpc_line(started_without, ["sentiment"], "http://127.0.0.1:8265")
    assert line.startswith("gRPC: not served: Serve was already running")
    assert "servegraph down" in line


def test_the_readmes_grpc_lines_call_a_router_ingress_on_serves_port() -> None:
    """GraphService is answered by routers: a line calling a deployment ingress would fail."""
    readme = (SAMPLES.parent.parent / "README.md").read_text()
    section = readme[readme.index("### gRPC") :]
    (sample,) = re.findall(r"servegraph up (config/samples/\S+) --start-local", section)
    calls = re.findall(r"servegraph call --grpc 127\.0\.0\.1:(\d+) --app (\S+)", section)
    assert calls
    apps = {a.name: a for a in load_graph(SAMPLES.parent.parent / sample).applications}
    for port, name in calls:
        assert int(port) == SERVE_GRPC_PORT
        assert not isinstance(apps[name].nodes[apps[name].ingress].kind, model.DeploymentKind), name
