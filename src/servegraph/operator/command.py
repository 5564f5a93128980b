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
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import kopf

    import servegraph.operator.handlers  # noqa: F401 - registers the handlers

    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    host, _, port = args.health_address.rpartition(":")
    options = Options(kubeconfig=args.kubeconfig, workers=args.workers, health_host=host, health_port=int(port))
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.PLAIN)
    logging.getLogger("servegraph").setLevel(logging.INFO)
    memo = kopf.Memo(options=options)
    namespaces = args.namespace or None
    asyncio.run(kopf.operator(clusterwide=namespaces is None, namespaces=namespaces or (), standalone=True, memo=memo))
    return 0
