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

from servegraph.extras import needs_extra


def add_arguments(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "status",
        help="a ServeGraph as a tree: each node's state and replicas, live version and digest, last rollout, conditions",
    )
    p.add_argument("name", help="the ServeGraph")
    p.add_argument("-n", "--namespace", help="its namespace (default: the kubeconfig context's, else default)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)")
    p.add_argument(
        "--no-replicas",
        action="store_true",
        help="do not ask Ray Serve (through the API server's service proxy) for live replica counts",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with needs_extra("operator"):
        from servegraph.statustree.gather import GatherError, NotFound, gather
    from servegraph.statustree.tree import render

    try:
        snapshot = asyncio.run(
            gather(args.name, args.namespace, kubeconfig=args.kubeconfig, live_replicas=not args.no_replicas)
        )
    except NotFound as exc:
        print(f"servegraph status: {exc}", file=sys.stderr)
        return 1
    except GatherError as exc:
        print(f"servegraph status: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(render(snapshot, datetime.now(UTC)))
    return 0
