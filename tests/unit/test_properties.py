"""Property tests: random valid DAGs render deterministically and survive every
encoding; random bytes never crash the parser."""

from __future__ import annotations

import pickle

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servegraph.dag import args
from servegraph.graph import Format, GraphError, decode, encode, parse_graph
from servegraph.graph.validate import to_model
from servegraph.render import RayServiceOptions, render_rayservice, render_serve_config, serve_config_yaml
from servegraph.v1 import graph_pb2

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.sampled_from([1e16, -1e-07, 5e-324, 1.5e300, 2.0**53 + 2]),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.text(max_size=12),
)
json_value = st.recursive(
    json_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=6
)


@st.composite
def dags(draw: st.DrawFn) -> graph_pb2.Graph:
    g = graph_pb2.Graph(name="prop", version=draw(st.text(max_size=8)), schema_version=1)
    for a in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 12))
        app = g.applications.add(name=f"app{a}", route_prefix=f"/app{a}", ingress="n0")
        if draw(st.booleans()):
            app.telemetry.forward_headers.extend(
                draw(st.lists(st.sampled_from(["x-tenant", "x-b3-flags"]), unique=True))
            )
            app.telemetry.disable_metrics = draw(st.booleans())
        for i in range(n):
            node = app.nodes[f"n{i}"]
            node.deployment.import_path = f"pkg.mod{i}:Cls"
            # every node but the ingress gets a parent among earlier nodes: reachable, acyclic
            children = [j for j in range(i + 1, n) if draw(st.booleans())]
            for j in children:
                node.deployment.args.add(node=graph_pb2.NodeRef(id=f"n{j}"))
            if draw(st.booleans()):
                node.deployment.kwargs["v"].value.CopyFrom(_to_value(draw(json_value)))
            node.resources.num_cpus = draw(st.sampled_from([0, 0.25, 1, 2]))
            node.resources.num_gpus = draw(st.sampled_from([0, 0, 0.5, 1, 2]))
            node.resources.memory_bytes = draw(st.sampled_from([0, 2**30]))
            if draw(st.booleans()):
                lo = draw(st.integers(0, 3))
                node.scaling.autoscaling.min_replicas = lo
                node.scaling.autoscaling.max_replicas = lo + draw(st.integers(1, 4))
            else:
                node.scaling.num_replicas = draw(st.integers(1, 3))
        for j in range(1, n):
            parents = [i for i in range(j) if any(a.node.id == f"n{j}" for a in app.nodes[f"n{i}"].deployment.args)]
            if not parents:
                app.nodes[f"n{draw(st.integers(0, j - 1))}"].deployment.args.add(node=graph_pb2.NodeRef(id=f"n{j}"))
    return g


def _to_value(v: object) -> object:
    from google.protobuf import struct_pb2

    s = struct_pb2.Struct()
    s.update({"v": v})
    return s.fields["v"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_random_dags_render_deterministically_and_round_trip(msg: graph_pb2.Graph) -> None:
    model = to_model(msg)
    text = serve_config_yaml(model)
    assert yaml.safe_load(text) == render_serve_config(model)
    for app, rendered in zip(model.applications, yaml.safe_load(text)["applications"], strict=True):
        # What validates, the runtime's args check accepts: no BuildError, every node in order.
        assert [n.id for n in args.decode(rendered["args"]).nodes] == list(app.order)
    manifest = render_rayservice(model, RayServiceOptions(name="prop"))
    # The operator parses in a child process and gets the model back pickled: nothing may be lost.
    assert pickle.loads(pickle.dumps(model)) == model
    for fmt in Format:
        again = decode(encode(msg, fmt), fmt)
        assert again == msg
        remodel = to_model(again)
        assert remodel == model
        assert serve_config_yaml(remodel) == text
        assert render_rayservice(remodel, RayServiceOptions(name="prop")) == manifest


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048), st.sampled_from(list(Format)))
def test_random_bytes_never_crash_the_parser(data: bytes, fmt: Format) -> None:
    try:
        parse_graph(data, fmt)
    except GraphError as exc:
        assert exc.problems
        assert all(str(p) for p in exc.problems)
