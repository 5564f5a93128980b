"""`servegraph up` and `servegraph down` on the command line: arguments only.

Imports nothing outside the standard library, so the CLI lists these commands
(and their --help) without the `ray` extra; running one without it says which
extra to install instead of failing on aiohttp.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

from servegraph.cli.common import STDIN, command, read_input
from servegraph.extras import needs_extra
from servegraph.graph.decode import DEFAULT_MAX_BYTES
from servegraph.raydash import DEFAULT_ADDRESS, DEFAULT_TIMEOUT_S


def add_arguments(subparsers: Any) -> None:
    """Register `up` and `down` on the CLI's subparsers (an argparse `_SubParsersAction`)."""
    up = command(
        subparsers,
        "up",
        help="deploy a graph onto a Ray cluster through its dashboard",
        description="Render FILE's Serve config (the operator's serveConfigV2), check that the cluster has room "
        "for it, PUT it to the Ray dashboard, wait until every application is RUNNING and print their URLs.",
        examples=[
            "servegraph up config/samples/mini.txtpb --start-local",
            "servegraph up graph.pb --address http://ray-head:8265 --timeout 600",
        ],
    )
    up.add_argument(
        "file", type=Path, help="graph file (.txtpb, .pb, .json; by content for another name), or - for stdin"
    )
    connection_arguments(up)
    up.add_argument(
        "--start-local",
        action="store_true",
        help="start a local Ray head (with token auth, sized for the graph) if no dashboard answers at --address",
    )
    up.add_argument(
        "--http-port",
        type=int,
        default=8000,
        help="Serve's HTTP port (default %(default)s), applied when this starts Serve on the cluster",
    )
    up.add_argument(
        "--grpc-port",
        type=int,
        default=9000,
        help="Serve's gRPC port (default %(default)s), applied when this starts Serve on the cluster",
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help="seconds to wait for RUNNING (default %(default)g)",
    )
    up.set_defaults(func=run_up)

    down = command(
        subparsers,
        "down",
        help="remove the Serve applications from a Ray cluster",
        description="DELETE the cluster's Serve applications (Ray shuts Serve down; the Ray cluster keeps running).",
        examples=["servegraph down", "servegraph down --address http://ray-head:8265"],
    )
    connection_arguments(down)
    down.set_defaults(func=run_down)


def dashboard_address() -> str:
    """Where the Ray dashboard is when no --address says: $RAY_DASHBOARD_ADDRESS, else the local one."""
    return os.environ.get("RAY_DASHBOARD_ADDRESS", DEFAULT_ADDRESS)


def connection_arguments(parser: argparse.ArgumentParser, *, given_only: bool = False) -> None:
    """--address and --token; `given_only`: --address stays None unless given (a command whose
    other form is a ServeGraph's tells the two apart by it)."""
    parser.add_argument(
        "--address",
        default=None if given_only else dashboard_address(),
        help="Ray dashboard URL (default $RAY_DASHBOARD_ADDRESS or " + DEFAULT_ADDRESS + ")",
    )
    parser.add_argument(
        "--token",
        default=None,
        help="Ray auth token; prefer $RAY_AUTH_TOKEN, $RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token "
        "(command lines are visible to other users)",
    )


def run_up(args: argparse.Namespace) -> int:
    with needs_extra("ray"):
        from servegraph.raydash.up import up
    data = None
    if str(args.file) == STDIN:
        data, args.file = read_input(STDIN, limit=DEFAULT_MAX_BYTES), Path("stdin")
    return asyncio.run(
        up(
            args.file,
            data=data,
            address=args.address,
            token=args.token,
            start_local=args.start_local,
            timeout_s=args.timeout,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
        )
    )


def run_down(args: argparse.Namespace) -> int:
    with needs_extra("ray"):
        from servegraph.raydash.up import down
    return asyncio.run(down(address=args.address, token=args.token))
