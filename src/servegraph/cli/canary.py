"""`servegraph canary`, `promote` and `abort` on the command line: arguments only.

On a plain Ray cluster (what `servegraph up` deployed) they run here, through the Ray
dashboard (`raydash/canary.py`, the `ray` extra). `promote NAME -n NS` and `abort NAME -n NS`
are a ServeGraph's (the operator moves its canary): with a NAME and no `--address` that is
the form. Standard library only at import time, so `servegraph --help` lists them without
any extra.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from servegraph.cli import kubeconfig
from servegraph.cli.common import STDIN, command, read_input
from servegraph.cli.deploy import connection_arguments, dashboard_address
from servegraph.cli.rollouts import dry_run_argument, end_canary
from servegraph.extras import needs_extra
from servegraph.graph.decode import DEFAULT_MAX_BYTES
from servegraph.raydash import DEFAULT_TIMEOUT_S


def _percent(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole percent") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{value} is not a percent from 0 to 100")
    return value


def add_arguments(subparsers: Any) -> None:
    p = command(
        subparsers,
        "canary",
        help="run a new version of a graph beside the one a Ray cluster serves, on a share of its requests",
        description="Run FILE's version beside what `servegraph up` deployed: the nodes that differ as copies in a "
        "side application, the rest shared, the ingress router sending WEIGHT percent of requests to it (no "
        "replica of what serves restarts). Run it again with the same FILE to change the weight; `servegraph "
        "promote` or `servegraph abort` ends it. Requests pin a version with the header x-servegraph-version.",
        examples=[
            "servegraph canary graph-v2.txtpb --weight 10",
            "servegraph canary graph-v2.txtpb --weight 0 --mirror 20",
            "servegraph canary graph-v2.txtpb --weight 50 --sticky-header x-user-id --address http://ray-head:8265",
        ],
    )
    p.add_argument("file", type=Path, help="the new version's graph file, or - for stdin")
    p.add_argument("--weight", type=_percent, required=True, help="percent of requests the new version serves")
    p.add_argument(
        "--mirror", type=_percent, default=0, help="percent of live requests copied to it, answers dropped (default 0)"
    )
    sticky = p.add_mutually_exclusive_group()
    sticky.add_argument("--sticky-header", metavar="H", help="keep each value of this request header on one version")
    sticky.add_argument(
        "--sticky-field", metavar="F", help="keep each value of this top-level JSON payload field on one version"
    )
    connection_arguments(p)
    _timeout(p)
    p.set_defaults(func=run_canary)

    for name, does in (("promote", "make the canary the only version"), ("abort", "remove the canary")):
        p = command(
            subparsers,
            name,
            help=f"{does}: of a ServeGraph (NAME -n NS), or on a plain Ray cluster (no NAME, or --address)",
            description=f"{does[0].upper()}{does[1:]}. With NAME and no --address: a ServeGraph's canary (the "
            "operator acts). Else the canary `servegraph canary` runs on the Ray cluster at --address"
            + (": its replicas keep running, the old version's nodes go." if name == "promote" else "."),
            examples=[
                f"servegraph {name}",
                f"servegraph {name} --address http://ray-head:8265",
                f"servegraph {name} fraud -n team-a",
            ],
        )
        p.add_argument("name", nargs="?", help="a ServeGraph (omit for the plain Ray cluster at --address)")
        kubeconfig.add_arguments(p)
        dry_run_argument(p)
        connection_arguments(p, given_only=True)
        _timeout(p)
        p.set_defaults(func=run_promote if name == "promote" else run_abort)


def _timeout(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds to wait for RUNNING (default %(default)g)"
    )


def run_canary(args: argparse.Namespace) -> int:
    with needs_extra("ray"):
        from servegraph.raydash.canary import Target, start
        from servegraph.render.canary import Split
    data = None
    if str(args.file) == STDIN:
        data, args.file = read_input(STDIN, limit=DEFAULT_MAX_BYTES), Path("stdin")
    split = Split(args.weight, args.mirror, args.sticky_header, args.sticky_field)
    return asyncio.run(start(args.file, split, Target(args.address, args.token, args.timeout), data=data))


def _finish(args: argparse.Namespace, promote: bool) -> int:
    if args.name is not None and args.address is None:
        return end_canary(args, "promote" if promote else "abort")
    with needs_extra("ray"):
        from servegraph.raydash.canary import Target, finish
    return asyncio.run(finish(promote, Target(args.address or dashboard_address(), args.token, args.timeout)))


def run_promote(args: argparse.Namespace) -> int:
    return _finish(args, True)


def run_abort(args: argparse.Namespace) -> int:
    return _finish(args, False)
