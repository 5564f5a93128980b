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

from servegraph.extras import needs_extra
from servegraph.raydash import DEFAULT_ADDRESS, DEFAULT_TIMEOUT_S


def add_arguments(subparsers: Any) -> None:
    """Register `up` and `down` on the CLI's subparsers (an argparse `_SubParsersAction`)."""
    up = subparsers.add_parser(
        "up",
        help="deploy a graph onto a Ray cluster through its dashboard",
        description="Render FILE's Serve config (the operator's serveConfigV2), PUT it to the Ray "
        "dashboard, wait until every application is RUNNING and print their URLs.",
    )
    up.add_argument("file", type=Path, help="graph file (.txtpb, .pb, .json)")
    _connection_arguments(up)
    up.add_argument(
        "--start-local",
        action="store_true",
        help="start a local Ray head (with token auth) if no dashboard answers at --address",
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

    down = subparsers.add_parser(
        "down",
        help="remove the Serve applications from a Ray cluster",
        description="DELETE the cluster's Serve applications (Ray shuts Serve down; the Ray cluster keeps running).",
    )
    _connection_arguments(down)
    down.set_defaults(func=run_down)


def _connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address",
        default=os.environ.get("RAY_DASHBOARD_ADDRESS", DEFAULT_ADDRESS),
        help="Ray dashboard URL (default $RAY_DASHBOARD_ADDRESS or %(default)s)",
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
    return asyncio.run(
        up(
            args.file,
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
