"""The `servegraph` command: validate, render, inspect, pack, diff, up/down, canary/promote/abort,
call, run, fetch, rollback, restart, status, completion.

Errors are one line per problem on stderr and a documented exit code, never a traceback:
the people reading them are registry authors and operators, not Python developers. A
command whose optional extra is not installed says which one, in one line.

Exit codes: 0 done (`diff`: no change); 1 `diff`: changes, `up`: not RUNNING in time,
`status`: no such ServeGraph; 2 invalid input or a refused action; 3 the kubeconfig, the
API server or the registry could not be read; 4 a bug in servegraph (SERVEGRAPH_DEBUG=1
shows its traceback); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence

from servegraph import grpc_client
from servegraph.cli import canary, completion, deploy, diff, graphs, observe, operate, rollouts
from servegraph.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    Failure,
    HelpFormatter,
    command,
    print_problems,
)
from servegraph.extras import MissingExtra
from servegraph.graph import GraphError

EXIT_BUG = 4


def version() -> str:
    """The installed distribution's version, else the package's own."""
    from importlib import metadata

    try:
        return metadata.version("servegraph")
    except metadata.PackageNotFoundError:
        from servegraph import __version__

        return __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except graphs.Invalid as exc:
        return graphs.report(exc)
    except GraphError as exc:
        print_problems("", exc.problems)
        return EXIT_INVALID
    except Failure as exc:
        print(str(exc), file=sys.stderr)
        return exc.code
    except MissingExtra as exc:
        print(f"servegraph {args.command}: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except OSError as exc:
        print(f"error: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug: still one line, unless asked for the traceback
        if os.environ.get("SERVEGRAPH_DEBUG"):
            raise
        print(
            f"servegraph {args.command}: internal error: {type(exc).__name__}: {exc} "
            "(a bug: please report it; SERVEGRAPH_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return EXIT_BUG


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="servegraph",
        description="Run serving graphs on Ray in Kubernetes.",
        epilog="Run `servegraph COMMAND --help` for a command's options and examples.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"servegraph {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    graphs.add_arguments(sub)
    diff.add_arguments(sub)

    p = command(
        sub,
        "call",
        help="call a served graph over gRPC (servegraph's GraphService); results as JSON lines",
        description="Send PAYLOAD (JSON) to application APP through Ray Serve's gRPC proxy at HOST:PORT "
        "and print the result, or with --stream each item, as one JSON line.",
        examples=[
            'servegraph call --grpc 127.0.0.1:9000 --app chat \'{"text": "a fine day"}\'',
            'servegraph call --grpc 127.0.0.1:9000 --app chat --stream --header x-model=b \'{"text": "hi"}\'',
        ],
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
    canary.add_arguments(sub)
    operate.add_arguments(sub)
    rollouts.add_arguments(sub)
    observe.add_arguments(sub)
    completion.add_arguments(sub, parser)
    return parser


def _call(args: argparse.Namespace) -> int:
    try:
        payload = json.loads(args.payload)
    except json.JSONDecodeError as exc:
        raise Failure(f"servegraph call: PAYLOAD_JSON is not JSON: {exc}") from None
    headers = {}
    for header in args.header:
        name, sep, value = header.partition("=")
        if not sep or not name.strip():
            raise Failure(f"servegraph call: --header {header!r}: write NAME=VALUE")
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


if __name__ == "__main__":
    sys.exit(main())
