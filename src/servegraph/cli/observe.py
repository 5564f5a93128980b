"""`servegraph status`'s arguments, and running it.

Only the standard library at import time, so the CLI lists `status` without the
`operator` extra; the Kubernetes client loads when it runs (a missing extra is one line).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from typing import Any

from servegraph.cli import kubeconfig
from servegraph.cli.common import EXIT_DIFFERENT, EXIT_UNREACHABLE, Failure, add_output, command, emit
from servegraph.extras import needs_extra


def add_arguments(subparsers: Any) -> None:
    p = command(
        subparsers,
        "status",
        help="a ServeGraph as a tree: each node's state and replicas, live version and digest, last rollout, conditions",
        examples=["servegraph status fraud -n team-a", "servegraph status fraud -o json | jq .applications"],
    )
    p.add_argument("name", help="the ServeGraph")
    kubeconfig.add_arguments(p)
    p.add_argument(
        "--no-replicas",
        action="store_true",
        help="do not ask Ray Serve (through the API server's service proxy) for live replica counts",
    )
    add_output(p, ("text", "json", "yaml"), "text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with needs_extra("operator"):
        from servegraph.statustree.gather import GatherError, NotFound, gather
    kubeconfig.check_files(args.kubeconfig, args.context)
    from servegraph.statustree.tree import render

    try:
        with kubeconfig.errors("status"):
            snapshot = asyncio.run(
                gather(
                    args.name,
                    args.namespace,
                    kubeconfig=args.kubeconfig,
                    context=args.context,
                    live_replicas=not args.no_replicas,
                )
            )
    except NotFound as exc:
        raise Failure(f"servegraph status: {exc}", EXIT_DIFFERENT) from None
    except GatherError as exc:
        raise Failure(f"servegraph status: {exc}", EXIT_UNREACHABLE) from None
    if args.output == "text":
        sys.stdout.write(render(snapshot, datetime.now(UTC)))
    else:
        from servegraph.statustree.document import document

        emit(document(snapshot), args.output)
    return 0
