"""DAG → Ray Serve config, in the shape `serve deploy`, the dashboard's
`PUT /api/serve/applications/` and KubeRay's serveConfigV2 all accept.

The wiring of each DAG travels in the application's `args` (Serve can only
override options of deployments the application builds; it cannot bind them),
written by `servegraph.dag.args` and read back by `servegraph.runtime:build`
inside Ray. Everything else goes into `deployments`, where KubeRay users expect
it and where Serve applies a change to one deployment alone: a `user_config`
change (the routers' graph version included) through `reconfigure`, without a
restart. A change to the args rebuilds the whole application.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import orjson
import yaml

from servegraph.dag import args, model
from servegraph.gcpause import gc_paused
from servegraph.graph.servicers import GRAPH_SERVICE_SERVICER
from servegraph.render.canary_plan import ready as canary_ready

SERVE_HTTP_PORT = 8000
SERVE_GRPC_PORT = 9000
"""Ray Serve's default gRPC port, written out: the serve Service's `serve-grpc` port must match it."""

_Base: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml is ~10x faster, same output


class _Dumper(_Base):  # type: ignore[misc]
    """Never emits anchors and aliases: readers of a manifest expect plain YAML."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: Any, data: str) -> Any:
    style = "|" if "\n" in data and not data.startswith(" ") else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)


def render_serve_config(
    graph: model.Graph, *, http_port: int = SERVE_HTTP_PORT, grpc_port: int = SERVE_GRPC_PORT
) -> dict[str, Any]:
    """Build the Serve config dict; key order is fixed so the YAML is stable.

    The ports are parameters for `servegraph up` on a machine where they are taken;
    a RayService always has the defaults, which its container ports name.
    """
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": "0.0.0.0", "port": http_port},  # noqa: S104 - Serve's proxy must be reachable by the Service
        "grpc_options": {"port": grpc_port, "grpc_servicer_functions": grpc_servicer_functions(graph)},
        "applications": [_application(graph, app) for app in graph.applications],
    }


def grpc_servicer_functions(graph: model.Graph) -> list[str]:
    """GraphService's servicer first, then every application's own, sorted and once each.

    Serve's gRPC options are cluster-wide, not per application: the union, in an
    order that does not depend on the applications' order, keeps the text stable.
    """
    own = {f for app in graph.applications for f in app.grpc_servicer_functions} - {GRAPH_SERVICE_SERVICER}
    return [GRAPH_SERVICE_SERVICER, *sorted(own)]


@gc_paused
def serve_config_yaml(
    graph: model.Graph, *, http_port: int = SERVE_HTTP_PORT, grpc_port: int = SERVE_GRPC_PORT, ready: bool = False
) -> str:
    """The exact serveConfigV2 string: same graph, byte-identical text.

    KubeRay re-pushes the config whenever this string changes, so determinism
    here is what keeps a steady cluster steady. See `config_yaml` for the layout.
    `ready`: ready for a canary (`canary_plan.ready`: every deployment's replicas as an
    autoscaling_config, so a canary can later scale an unused node to zero without
    restarting the application).
    """
    config = render_serve_config(graph, http_port=http_port, grpc_port=grpc_port)
    return config_yaml(canary_ready(config) if ready else config)


def config_yaml(config: Mapping[str, Any]) -> str:
    """YAML with one line per node and per deployment.

    The upper levels (applications, args) are block YAML; each node, each
    deployment's options and other deep values are one JSON line, which is a
    YAML flow collection. A change to one node is then a one-line diff in
    GitOps review, and emitting it is ~30x faster than PyYAML's representer
    (10,000 nodes: ~0.1 s instead of ~2 s) because each line is one C JSON encode.
    """
    lines: list[str] = []
    _emit(config, 0, "", lines, _encode)
    text = "\n".join(lines) + "\n"
    if _needs_care(text):
        # Rare: some line needs numbers dotted or characters escaped. Checking the
        # whole text once is cheaper than checking each of 20,000 lines.
        lines.clear()
        _emit(config, 0, "", lines, _json)
        text = "\n".join(lines) + "\n"
    return text


def _escape(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}"


_FLOW_DEPTH = 4
# No trailing ":": YAML reads `route_prefix: /a:` as a nested mapping and rejects it.
_PLAIN = re.compile(r"[A-Za-z_/](?:[A-Za-z0-9_./:-]*[A-Za-z0-9_./-])?")
_YAML11_WORDS = frozenset({"y", "n", "yes", "no", "true", "false", "on", "off", "null"})
# Characters YAML reads as line breaks, forbids raw, or treats as a BOM: escape them.
_YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]")


# orjson: the same JSON as the standard library, but compact and 7x faster per line
# (0.4 µs against 2.7 µs for a node), which is most of the emitting time at 20,000
# lines. It writes exponents as 1e+16, where YAML 1.1 readers (PyYAML) need a dot
# to see a float: `_json` adds one. It writes NaN as null; validation refuses NaN.


def _encode(value: Any) -> str:
    return orjson.dumps(value).decode()


_EXPONENT_HINT = re.compile(r"\de[-+]?\d")
_DOTLESS_EXPONENT = re.compile(r'("(?:[^"\\]|\\.)*")|(?<![\w.])(-?\d+)(e[-+]?\d+)')


# What orjson writes for an exponent, found by its literal start (fast) and then
# checked for the digit before it: `1e+16`, `1.5e-7`; most "e-" are in names.
_EXPONENT_TAIL = re.compile(r"e[-+]\d")


def _needs_care(text: str) -> bool:
    """Whether any line of `text` needs `_json`'s rewriting; one cheap scan of the whole."""
    if "\x7f" in text or (not text.isascii() and _YAML_UNSAFE.search(text)):
        return True
    return any(m.start() and text[m.start() - 1].isdigit() for m in _EXPONENT_TAIL.finditer(text))


def _dotted(m: re.Match[str]) -> str:
    return m.group(1) or f"{m.group(2)}.0{m.group(3)}"


Encoder = Callable[[Any], str]


def _flow(value: Any, encode: Encoder) -> str:
    if isinstance(value, str) and _PLAIN.fullmatch(value) and value.lower() not in _YAML11_WORDS:
        return value
    text = encode(value)
    if len(text) > _LONG_KEY and _has_long_key(value):
        return _explicit_keys(value)
    return text


def _json(value: Any) -> str:
    """JSON of a value, fit to stand in YAML."""
    text = _encode(value)
    if _EXPONENT_HINT.search(text):
        text = _DOTLESS_EXPONENT.sub(_dotted, text)
    if _YAML_UNSAFE.search(text):
        text = _YAML_UNSAFE.sub(_escape, text)
    return text


# YAML readers (PyYAML, libyaml, go-yaml) drop or reject a mapping key written
# without `? ` once it spans more than 1024 characters.
_LONG_KEY = 1000


def _has_long_key(value: Any) -> bool:
    if isinstance(value, Mapping):
        return any(len(_json(k)) > _LONG_KEY or _has_long_key(v) for k, v in value.items())
    return isinstance(value, list) and any(_has_long_key(v) for v in value)


def _explicit_keys(value: Any) -> str:
    """Flow YAML with every key marked by `? `, which has no length limit."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"? {_json(k)}: {_explicit_keys(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_explicit_keys(v) for v in value) + "]"
    return _json(value)


def _key(key: str, encode: Encoder) -> str:
    return key if _PLAIN.fullmatch(key) and key.lower() not in _YAML11_WORDS else _flow(key, encode)


def _emit(value: Mapping[str, Any] | list[Any], depth: int, indent: str, lines: list[str], encode: Encoder) -> None:
    """Append `value` as block YAML at `indent`; deep or scalar items become flow lines."""
    pairs = (
        [(f"{indent}{_key(k, encode)}:", v) for k, v in value.items()]
        if isinstance(value, Mapping)
        else [(f"{indent}-", v) for v in value]
    )
    for head, item in pairs:
        block = isinstance(item, list) or (isinstance(item, Mapping) and depth + 1 < _FLOW_DEPTH)
        if not block or not item:
            lines.append(f"{head} {_flow(item, encode)}")
            continue
        sub: list[str] = []
        _emit(item, depth + 1, indent + "  ", sub, encode)
        if head.endswith("-") and isinstance(item, Mapping):
            # A mapping in a list starts on the dash's line, as PyYAML writes it.
            lines.append(f"{head} {sub[0].lstrip()}")
            lines.extend(sub[1:])
        else:
            lines.append(head)
            lines.extend(sub)


def dump_yaml(data: Any) -> str:
    """PyYAML for whole manifests: multi-line strings (serveConfigV2) as `|` blocks."""
    return str(
        yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1 << 16)
    )


def _application(graph: model.Graph, app: model.Application) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": app.name,
        "route_prefix": app.route_prefix,
        "import_path": args.BUILDER,
    }
    env = _runtime_env(app.runtime_env)
    if env:
        out["runtime_env"] = env
    out["args"] = args.encode(graph, app)
    router_config = args.router_user_config(graph)
    out["deployments"] = [
        deployment_options(node, None if isinstance(node.kind, model.DeploymentKind) else router_config)
        for node in app.ordered_nodes()
    ]
    return out


def _runtime_env(env: model.RuntimeEnv) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if env.pip:
        out["pip"] = list(env.pip)
    if env.env_vars:
        out["env_vars"] = dict(env.env_vars)
    if env.working_dir:
        out["working_dir"] = env.working_dir
    if env.py_modules:
        out["py_modules"] = list(env.py_modules)
    return out


def deployment_options(node: model.Node, router_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Ray Serve deployment options for one node; unset fields keep Serve's defaults.

    `router_config` is a router's `user_config` (routers take none from the graph).
    """
    out: dict[str, Any] = {"name": node.id}
    a = node.autoscaling
    if a is not None:
        auto: dict[str, Any] = {"min_replicas": a.min_replicas, "max_replicas": a.max_replicas}
        for key in _AUTOSCALING_OPTIONS:
            value = getattr(a, key)
            if value is not None:
                auto[key] = value
        out["autoscaling_config"] = auto
    else:
        out["num_replicas"] = 1 if node.num_replicas is None else node.num_replicas
    for key in _NODE_OPTIONS:
        value = getattr(node, key)
        if value is not None:
            out[key] = value
    if router_config is not None:
        out["user_config"] = dict(router_config)
    elif node.user_config is not None:
        out["user_config"] = dict(node.user_config)
    actor = _actor_options(node.resources)
    if actor:
        out["ray_actor_options"] = actor
    return out


# Optional options, in the order they are written; a node field of the same name carries each.
_AUTOSCALING_OPTIONS = ("initial_replicas", "target_ongoing_requests", "upscale_delay_s", "downscale_delay_s")
_NODE_OPTIONS = (
    "max_ongoing_requests",
    "max_queued_requests",
    "health_check_period_s",
    "health_check_timeout_s",
    "graceful_shutdown_wait_loop_s",
    "graceful_shutdown_timeout_s",
    "max_replicas_per_node",
)


def _actor_options(r: model.Resources) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if r.num_cpus is not None:
        out["num_cpus"] = r.num_cpus
    if r.num_gpus:
        out["num_gpus"] = r.num_gpus
    if r.memory_bytes:
        out["memory"] = r.memory_bytes
    if r.custom:
        out["resources"] = dict(r.custom)
    if r.accelerator_type:
        out["accelerator_type"] = r.accelerator_type
    return out
