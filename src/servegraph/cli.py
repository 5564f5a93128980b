"""The `servegraph` command: validate, render, inspect, pack, up/down, run, demo.

Errors are one line per problem on stderr and a non-zero exit code, never a
traceback: the people reading them are registry authors, not Python developers.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from servegraph.graph import Format, GraphError, decode, encode, load_graph
from servegraph.graph.validate import to_model
from servegraph.render import RayServiceOptions, render_rayservice, serve_config_yaml
from servegraph.render.inspect import describe, to_dot
from servegraph.render.serve_config import dump_yaml

EXIT_INVALID = 2

# Subcommands whose modules pull in optional dependencies (ray client, kopf) are
# registered by those modules, so `validate` and `render` stay light.
_OPTIONAL_COMMANDS = ("servegraph.up", "servegraph.operator.command", "servegraph.demo")


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
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="servegraph", description="Run serving graphs on Ray in Kubernetes.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("validate", help="check a graph; every problem on stderr")
    p.add_argument("file", type=Path)
    p.set_defaults(func=_validate)

    p = sub.add_parser("render", help="print the Ray Serve config or the KubeRay RayService as YAML")
    p.add_argument("file", type=Path)
    p.add_argument("--format", choices=("serve", "rayservice"), default="rayservice")
    p.add_argument("--name", help="RayService name (default: the graph's name)")
    p.add_argument("--namespace")
    p.add_argument("--image", help="Ray image for head and workers")
    p.add_argument("--ray-version")
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

    for module in _OPTIONAL_COMMANDS:
        try:
            importlib.import_module(module).add_arguments(sub)
        except ImportError:
            continue  # optional extra not installed; its commands are simply absent
    return parser


def _validate(args: argparse.Namespace) -> int:
    graph = load_graph(args.file)
    apps = len(graph.applications)
    print(
        f"{args.file}: graph {graph.name!r} version {graph.version!r} is valid ({apps} applications, {graph.node_count} nodes)"
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
    sys.stdout.write(dump_yaml(render_rayservice(graph, options)))
    return 0


def _inspect(args: argparse.Namespace) -> int:
    graph = load_graph(args.file)
    sys.stdout.write(to_dot(graph) if args.dot else describe(graph))
    return 0


def _pack(args: argparse.Namespace) -> int:
    msg = decode(args.file.read_bytes(), Format.from_path(args.file))
    to_model(msg)  # refuse to pack an invalid graph
    args.output.write_bytes(encode(msg, Format(args.to)))
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
