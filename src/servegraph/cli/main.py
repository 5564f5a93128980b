"""The `servegraph` command: validate, render, inspect, pack, diff, up/down, call, run, rollback, restart, status.

Errors are one line per problem on stderr and a non-zero exit code, never a
traceback: the people reading them are registry authors, not Python developers.
A command whose optional extra is not installed says which one, in one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from servegraph import grpc_client
from servegraph.cli import deploy, observe, operate, rollouts
from servegraph.extras import MissingExtra
from servegraph.graph import Format, GraphError, Problem, decode, encode, load_graph
from servegraph.graph.validate import to_model
from servegraph.operator.spec import pod_overrides
from servegraph.render import RayServiceOptions, render_rayservice, serve_config_yaml
from servegraph.render.inspect import describe, to_dot
from servegraph.render.serve_config import dump_yaml

EXIT_INVALID = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except GraphError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_INVALID
    except OSError as exc:
        print(f"error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_INVALID
    except MissingExtra as exc:
        print(f"servegraph {args.command}: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="servegraph", description="Run serving graphs on Ray in Kubernetes.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    pods_help = (
        "a ServeGraph manifest, or its spec.rayService section, whose head and worker overrides "
        "the graph must fit (worker counts are planned for those pods)"
    )
    p = sub.add_parser("validate", help="check a graph; every problem on stderr")
    p.add_argument("file", type=Path)
    p.add_argument("--pods", type=Path, metavar="FILE", help=pods_help)
    p.set_defaults(func=_validate)

    p = sub.add_parser("render", help="print the Ray Serve config or the KubeRay RayService as YAML")
    p.add_argument("file", type=Path)
    p.add_argument("--format", choices=("serve", "rayservice"), default="rayservice")
    p.add_argument("--name", help="RayService name (default: the graph's name)")
    p.add_argument("--namespace")
    p.add_argument("--image", help="Ray image for head and workers")
    p.add_argument("--ray-version")
    p.add_argument("--pods", type=Path, metavar="FILE", help=pods_help)
    p.set_defaults(func=_render)

    p = sub.add_parser("inspect", help="summarise applications, nodes, edges, resources, worker groups")
    p.add_argument("file", type=Path)
    p.add_argument("--dot", action="store_true", help="print a Graphviz digraph instead")
    p.set_defaults(func=_inspect)

    p = sub.add_parser("pack", help="convert a text or JSON graph to the binary wire format")
    p.add_argument("file", type=Path)
    p.add_argument("-o", "--output", type=Path, required=True)
    p.add_argument("--to", choices=[f.value for f in Format], default=Format.BINARY.value)
    p.set_defaults(func=_pack)

    p = sub.add_parser(
        "call",
        help="call a served graph over gRPC (servegraph's GraphService); results as JSON lines",
        description="Send PAYLOAD (JSON) to application APP through Ray Serve's gRPC proxy at HOST:PORT "
        "and print the result, or with --stream each item, as one JSON line.",
    )
    p.add_argument("payload", metavar="PAYLOAD_JSON", help='the request body, e.g. \'{"text": "a fine day"}\'')
    p.add_argument("--grpc", required=True, metavar="HOST:PORT", help="Serve's gRPC proxy (port 9000 by default)")
    p.add_argument("--app", required=True, metavar="APP", help="the application's name in the graph")
    p.add_argument("--stream", action="store_true", help="call Stream: print each item as it arrives")
    p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE", help="a request header (repeatable)")
    p.add_argument(
        "--timeout",
        type=float,
        default=grpc_client.DEFAULT_TIMEOUT_S,
        help="seconds for the whole call, a stream's included (default %(default)g)",
    )
    p.set_defaults(func=_call)

    # Always listed; their modules load the optional extras only when they run.
    deploy.add_arguments(sub)
    operate.add_arguments(sub)
    rollouts.add_arguments(sub)
    observe.add_arguments(sub)
    return parser


def _validate(args: argparse.Namespace) -> int:
    graph = load_graph(args.file)
    fits = ""
    if args.pods is not None:
        render_rayservice(graph, _with_pods(RayServiceOptions(name=graph.name or "graph"), args.pods))
        fits = f", fits the pods of {args.pods}"
    apps = len(graph.applications)
    print(
        f"{args.file}: graph {graph.name!r} version {graph.version!r} is valid "
        f"({apps} applications, {graph.node_count} nodes){fits}"
    )
    return 0


def _render(args: argparse.Namespace) -> int:
    graph = load_graph(args.file)
    if args.format == "serve":
        sys.stdout.write(serve_config_yaml(graph))
        return 0
    options = RayServiceOptions(
        name=args.name or graph.name,
        namespace=args.namespace,
        image=args.image,
        ray_version=args.ray_version,
    )
    if args.pods is not None:
        options = _with_pods(options, args.pods)
    sys.stdout.write(dump_yaml(render_rayservice(graph, options)))
    return 0


def _with_pods(options: RayServiceOptions, path: Path) -> RayServiceOptions:
    """The options with the head and worker overrides of a ServeGraph (or its rayService section)."""
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise GraphError([Problem(str(path), f"not YAML: {exc}")]) from None
    ray_service: Any = doc
    if isinstance(doc, Mapping) and isinstance(doc.get("spec"), Mapping):
        ray_service = doc["spec"].get("rayService") or {}
    if not isinstance(ray_service, Mapping):
        raise GraphError([Problem(str(path), "must be a ServeGraph or its spec.rayService mapping")])
    head, workers = pod_overrides(ray_service)
    return replace(options, head=head, workers=workers)


def _inspect(args: argparse.Namespace) -> int:
    graph = load_graph(args.file)
    sys.stdout.write(to_dot(graph) if args.dot else describe(graph))
    return 0


def _call(args: argparse.Namespace) -> int:
    try:
        payload = json.loads(args.payload)
    except json.JSONDecodeError as exc:
        print(f"servegraph call: PAYLOAD_JSON is not JSON: {exc}", file=sys.stderr)
        return EXIT_INVALID
    headers = {}
    for header in args.header:
        name, sep, value = header.partition("=")
        if not sep or not name.strip():
            print(f"servegraph call: --header {header!r}: write NAME=VALUE", file=sys.stderr)
            return EXIT_INVALID
        headers[name.strip().lower()] = value
    target, app = args.grpc, args.app
    try:
        if args.stream:
            for item in grpc_client.stream(target, app, payload, headers, timeout_s=args.timeout):
                print(json.dumps(item), flush=True)
        else:
            print(json.dumps(grpc_client.call(target, app, payload, headers, timeout_s=args.timeout)))
    except grpc_client.CallError as exc:
        print(f"servegraph call: {exc}", file=sys.stderr)
        return 1
    return 0


def _pack(args: argparse.Namespace) -> int:
    msg = decode(args.file.read_bytes(), Format.from_path(args.file))
    to_model(msg)  # refuse to pack an invalid graph
    args.output.write_bytes(encode(msg, Format(args.to)))
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
