"""`servegraph validate`, `render`, `inspect` and `pack`: a graph file, offline.

`validate` holds a graph to every limit the operator holds it to (`graph.limits`): its
size as downloaded, its nodes, their replicas and memory, and the size of the RayService
it renders — for the ServeGraph given with `--pods`, else for one named after the graph.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from servegraph.cli.common import (
    EXIT_INVALID,
    Failure,
    add_output,
    command,
    emit,
    name_of,
    plural,
    print_problems,
    read_input,
)
from servegraph.cli.pods import PLACEHOLDER_UID, Pods, read_pods
from servegraph.dag.model import Graph
from servegraph.graph import DEFAULT_MAX_BYTES, Format, GraphError, Problem, decode_file, encode
from servegraph.graph.limits import MAX_GRAPH_BYTES, graph_too_large, manifest_bytes, rayservice_too_large
from servegraph.graph.validate import to_model
from servegraph.names import API_VERSION, GRAPH_LABEL, KIND
from servegraph.render import RayServiceOptions, render_rayservice, serve_config_yaml
from servegraph.render.inspect import describe, summary, to_dot
from servegraph.render.serve_config import dump_yaml

GRAPH_FILE = "graph file (.pb, .txtpb, .json; by content for another name), or - for stdin"
PODS_HELP = (
    "a ServeGraph manifest (any file kubectl applies: several documents, kind: List) whose pods the graph "
    "must fit, checked against the CRD's schema; worker counts are planned for those pods"
)
DOT_TIMEOUT_S = 60.0


class Invalid(Exception):
    """Problems with one input: printed `error: WHERE: problem`, capped, exit 2."""

    def __init__(self, where: str, problems: Sequence[object]) -> None:
        super().__init__(f"{where}: {len(problems)} problems")
        self.where = where
        self.problems = list(problems)


def add_arguments(sub: Any) -> None:
    p = command(
        sub,
        "validate",
        help="check a graph as the operator would: every problem on stderr, one line each",
        examples=[
            "servegraph validate config/samples/mini.txtpb",
            "servegraph validate graph.pb --pods config/samples/mini.yaml -o json",
        ],
    )
    p.add_argument("file", help=GRAPH_FILE)
    p.add_argument("--pods", metavar="FILE", help=PODS_HELP)
    p.add_argument(
        "--max-graph-bytes",
        type=int,
        default=MAX_GRAPH_BYTES,
        help="the operator's --max-graph-bytes: the largest graph it downloads",
    )
    add_output(p, ("text", "json", "yaml"), "text")
    p.set_defaults(func=validate)

    p = command(
        sub,
        "render",
        help="print the KubeRay RayService (or the Ray Serve config) the operator would apply",
        examples=[
            "servegraph render config/samples/mini.txtpb --name web --namespace prod",
            "servegraph render graph.pb --format serve > serve.yaml",
        ],
    )
    p.add_argument("file", help=GRAPH_FILE)
    p.add_argument("--format", choices=("serve", "rayservice"), default="rayservice", help="what to render")
    p.add_argument("--name", help="RayService name (default: the graph's name)")
    p.add_argument("-n", "--namespace", help="the RayService's namespace (default: none written)")
    p.add_argument("--image", help="Ray image for head and workers")
    p.add_argument("--ray-version", help="rayVersion of the RayService")
    p.add_argument("--pods", metavar="FILE", help=PODS_HELP)
    add_output(p, ("yaml", "json"), "yaml")
    p.set_defaults(func=render)

    p = command(
        sub,
        "inspect",
        help="summarise applications, nodes, edges, resources and worker groups; or draw them",
        examples=[
            "servegraph inspect config/samples/observed.txtpb",
            "servegraph inspect config/samples/observed.txtpb -o svg > observed.svg",
        ],
    )
    p.add_argument("file", help=GRAPH_FILE)
    add_output(p, ("text", "json", "yaml", "dot", "svg"), "text")
    p.add_argument("--dot", action="store_true", help="the same as -o dot")
    p.set_defaults(func=inspect)

    p = command(
        sub,
        "pack",
        help="convert a graph between the binary wire format and text or JSON (refuses invalid graphs)",
        examples=[
            "servegraph pack config/samples/mini.txtpb --output mini.pb",
            "servegraph pack mini.pb --output mini.json --to json",
        ],
    )
    p.add_argument("file", help=GRAPH_FILE)
    p.add_argument("--output", required=True, metavar="FILE", help="where to write the graph")
    p.add_argument("--to", choices=[f.value for f in Format], default=Format.BINARY.value, help="the format to write")
    p.set_defaults(func=pack)


# ---- reading a graph -------------------------------------------------------------------


@dataclass(frozen=True)
class Loaded:
    graph: Graph
    wire_bytes: int
    """Its size as binary protobuf: what a registry serves and the operator downloads."""


def load(path: str, *, max_graph_bytes: int | None = None) -> Loaded:
    """The graph in `path` (or stdin), validated; Invalid naming the file otherwise.

    With `max_graph_bytes`, a graph larger than that as binary is refused too, beside any
    other problem it has.
    """
    where = name_of(path)
    data = read_input(path, limit=DEFAULT_MAX_BYTES)
    try:
        msg = decode_file(data, "" if path == "-" else path, max_bytes=DEFAULT_MAX_BYTES)
    except GraphError as exc:
        raise Invalid(where, [*exc.problems, *_manifest_hint(data)]) from None
    wire = len(encode(msg))
    too_large = graph_too_large(wire, max_graph_bytes) if max_graph_bytes is not None else None
    try:
        graph = to_model(msg)
    except GraphError as exc:
        raise Invalid(where, [*([too_large] if too_large else []), *exc.problems]) from None
    if too_large:
        raise Invalid(where, [too_large])
    return Loaded(graph, wire)


def _manifest_hint(data: bytes) -> list[str]:
    """A Kubernetes manifest given as a graph: say so, rather than only that it does not decode."""
    head = data[:4096].decode("utf-8", errors="replace")
    if "apiVersion:" in head and "kind:" in head:
        kind = head.split("kind:", 1)[1].split()[0] if head.split("kind:", 1)[1].split() else "?"
        return [f"this is a Kubernetes manifest (kind {kind}), not a graph; a ServeGraph goes to --pods"]
    return []


def operator_options(graph: Graph, name: str | None = None, namespace: str = "default") -> RayServiceOptions:
    """What the operator renders for a ServeGraph named `name` (the graph's name) that
    overrides nothing: its labels and owner reference count in the RayService's size."""
    sg = name or graph.name
    owner: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND, "name": sg, "uid": PLACEHOLDER_UID}
    owner |= {"controller": True, "blockOwnerDeletion": True}
    return RayServiceOptions(name=sg, namespace=namespace, labels={GRAPH_LABEL: sg}, owner_references=(owner,))


def rendered(graph: Graph, where: str, options: RayServiceOptions, pods: Pods | None = None) -> dict[str, Any]:
    """The RayService, refused as the operator refuses it: replicas that fit no pod, or too large."""
    try:
        manifest = render_rayservice(graph, options)
    except GraphError as exc:
        into = f" (in the pods of {pods.label})" if pods else ""
        raise Invalid(where, [f"{p}{into}" for p in exc.problems]) from None
    refused = rayservice_too_large(manifest["metadata"]["name"], manifest_bytes(manifest))
    if refused:
        raise Invalid(where, [refused])
    return manifest


# ---- the commands ----------------------------------------------------------------------


def validate(args: argparse.Namespace) -> int:
    where = name_of(args.file)
    try:
        loaded = load(args.file, max_graph_bytes=args.max_graph_bytes)
        graph = loaded.graph
        all_pods = read_pods(args.pods, graph.name) if args.pods else []
        sizes = [
            manifest_bytes(rendered(graph, where, p.options, p))
            for p in all_pods or [Pods("", operator_options(graph))]
        ]
    except Invalid as exc:
        if args.output == "text":
            raise
        problems = [_problem(p) for p in exc.problems]
        emit({"file": where, "valid": False, "problems": problems}, args.output)
        return EXIT_INVALID
    fits = [p.label for p in all_pods]
    if args.output != "text":
        document = {
            "file": where,
            "valid": True,
            "graph": {
                "name": graph.name,
                "version": graph.version,
                "applications": len(graph.applications),
                "nodes": graph.node_count,
            },
            "bytes": loaded.wire_bytes,
            "rayServiceBytes": max(sizes),
            "fits": fits,
        }
        emit(document, args.output)
        return 0
    pods = f", fits the pods of {', '.join(fits)} in {name_of(args.pods)}" if fits else ""
    print(
        f"{where}: graph {graph.name!r} version {graph.version!r} is valid "
        f"({plural(len(graph.applications), 'application')}, {plural(graph.node_count, 'node')}; "
        f"{loaded.wire_bytes:,} bytes, RayService {max(sizes):,} bytes){pods}"
    )
    return 0


def _problem(problem: object) -> dict[str, str]:
    if isinstance(problem, Problem):
        return {"path": problem.path, "message": problem.message}
    return {"path": "", "message": str(problem)}


def render(args: argparse.Namespace) -> int:
    where = name_of(args.file)
    graph = load(args.file).graph
    if args.format == "serve":
        text = serve_config_yaml(graph)
        if args.output == "json":
            import yaml

            emit(yaml.safe_load(text), "json")
        else:
            sys.stdout.write(text)
        return 0
    options = RayServiceOptions(
        name=args.name or graph.name, namespace=args.namespace, image=args.image, ray_version=args.ray_version
    )
    pods = None
    if args.pods:
        found = read_pods(args.pods, graph.name)
        if len(found) > 1:
            raise Failure(
                f"error: {name_of(args.pods)}: holds {plural(len(found), 'ServeGraph')} "
                f"({', '.join(p.label for p in found)}); render takes one"
            )
        pods = found[0]
        chosen = pods.options
        options = replace(
            chosen,
            name=args.name or chosen.name,
            namespace=args.namespace or chosen.namespace,
            image=args.image or chosen.image,
            ray_version=args.ray_version or chosen.ray_version,
        )
    manifest = rendered(graph, where, options, pods)
    if args.output == "json":
        emit(manifest, "json")
    else:
        sys.stdout.write(dump_yaml(manifest))
    return 0


def inspect(args: argparse.Namespace) -> int:
    graph = load(args.file).graph
    fmt = "dot" if args.dot else args.output
    if fmt == "text":
        sys.stdout.write(describe(graph))
    elif fmt in ("json", "yaml"):
        emit(summary(graph), fmt)
    elif fmt == "dot":
        sys.stdout.write(to_dot(graph))
    else:
        sys.stdout.write(svg(to_dot(graph)))
    return 0


def svg(dot_text: str) -> str:
    """The digraph drawn by Graphviz's `dot`; one clear line when it is not installed."""
    dot = shutil.which("dot")
    if dot is None:
        raise Failure(
            "servegraph inspect: -o svg needs Graphviz's `dot`, which is not on PATH "
            "(apt-get install graphviz, brew install graphviz); -o dot prints what it would draw"
        )
    try:
        done = subprocess.run(
            [dot, "-Tsvg"], input=dot_text, capture_output=True, text=True, timeout=DOT_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise Failure(f"servegraph inspect: `dot` did not finish in {DOT_TIMEOUT_S:g}s") from None
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or ["no message"])[0]
        raise Failure(f"servegraph inspect: `dot -Tsvg` failed (exit {done.returncode}): {first}")
    return done.stdout


def pack(args: argparse.Namespace) -> int:
    where = name_of(args.file)
    data = read_input(args.file, limit=DEFAULT_MAX_BYTES)
    try:
        msg = decode_file(data, "" if args.file == "-" else args.file, max_bytes=DEFAULT_MAX_BYTES)
        to_model(msg)  # refuse to pack an invalid graph
    except GraphError as exc:
        raise Invalid(where, [*exc.problems, *_manifest_hint(data)]) from None
    Path(args.output).write_bytes(encode(msg, Format(args.to)))
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


def report(exc: Invalid) -> int:
    """How main prints an Invalid."""
    print_problems(exc.where, exc.problems)
    return EXIT_INVALID
