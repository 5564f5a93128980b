"""`servegraph run`: start the operator (kubeconfig or in-cluster)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from typing import Any

from servegraph.operator.runtime import Options


def add_arguments(subparsers: Any) -> None:
    p = subparsers.add_parser("run", help="run the operator")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)")
    p.add_argument(
        "-n", "--namespace", action="append", default=[], help="watch only this namespace (repeatable); default: all"
    )
    p.add_argument("--workers", type=int, default=4, help="concurrent reconciles")
    p.add_argument("--health-address", default="0.0.0.0:8080", help="host:port of /healthz, /readyz and /metrics")
    p.add_argument("--leader-elect", action="store_true", help="run several replicas; one reconciles (Lease)")
    p.add_argument("--leader-election-namespace", default=os.environ.get("POD_NAMESPACE", "servegraph-system"))
    p.add_argument("--leader-election-id", default="servegraph-operator", help="name of the Lease")
    p.add_argument(
        "--events-address", default="", help="host:port of POST /v1/events (graph published); off when empty"
    )
    p.add_argument(
        "--events-token-secret",
        default="",
        metavar="NAMESPACE/NAME",
        help="Secret whose `token` key authenticates events",
    )
    p.add_argument(
        "--allowed-source-hosts",
        default="*",
        help="comma-separated host globs graphs may be downloaded from; link-local and metadata addresses are always refused",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import kopf

    import servegraph.operator.handlers  # noqa: F401 - registers the handlers

    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    host, _, port = args.health_address.rpartition(":")
    events_host, _, events_port = args.events_address.rpartition(":")
    parts = args.events_token_secret.split("/", 1)
    secret = (parts[0], parts[1]) if len(parts) == 2 else None
    if args.events_address and secret is None:
        raise SystemExit("servegraph run: --events-address needs --events-token-secret NAMESPACE/NAME")
    options = Options(
        kubeconfig=args.kubeconfig,
        workers=args.workers,
        health_host=host,
        health_port=int(port),
        leader_elect=args.leader_elect,
        lease_namespace=args.leader_election_namespace,
        lease_name=args.leader_election_id,
        events_host=events_host if args.events_address else None,
        events_port=int(events_port or 0),
        events_token_secret=secret,
        allowed_source_hosts=tuple(h for h in args.allowed_source_hosts.split(",") if h.strip()),
    )
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.PLAIN)
    logging.getLogger("servegraph").setLevel(logging.INFO)
    if not args.verbose:
        # kopf logs every handler call at INFO; our own log has one line per transition.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    memo = kopf.Memo(options=options)
    namespaces = args.namespace or None
    asyncio.run(kopf.operator(clusterwide=namespaces is None, namespaces=namespaces or (), standalone=True, memo=memo))
    return 0
