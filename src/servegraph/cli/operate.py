"""`servegraph run` (the operator) and `servegraph fetch` (one download, as the operator makes it).

Only the standard library at import time, so the CLI lists both without the
`operator` extra; the operator's modules load when they run. The two share the
source-policy and limit flags and the code behind them, so `fetch` refuses what
the operator refuses, with the same message.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

from servegraph.cli.common import EXIT_INVALID, EXIT_UNREACHABLE, Failure, command
from servegraph.extras import needs_extra
from servegraph.graph.limits import MAX_GRAPH_BYTES
from servegraph.names import LEASE_NAME, OPERATOR_NAMESPACE

MiB = 1024 * 1024
EXIT_FETCH_FAILED = 3


def add_arguments(subparsers: Any) -> None:
    p = command(
        subparsers,
        "run",
        help="run the operator",
        examples=[
            "servegraph run --leader-elect --allowed-source-hosts 'registry.example.com'",
            "servegraph run --kubeconfig ~/.kube/config -n team-a -n team-b",
        ],
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)")
    p.add_argument("--context", help="the kubeconfig context to use (default: its current-context)")
    p.add_argument(
        "-n", "--namespace", action="append", default=[], help="watch only this namespace (repeatable); default: all"
    )
    p.add_argument("--workers", type=int, default=4, help="concurrent reconciles")
    p.add_argument("--health-address", default="0.0.0.0:8080", help="host:port of /healthz, /readyz and /metrics")
    p.add_argument("--leader-elect", action="store_true", help="run several replicas; one reconciles (Lease)")
    p.add_argument("--leader-election-namespace", default=os.environ.get("POD_NAMESPACE", OPERATOR_NAMESPACE))
    p.add_argument(
        "--leader-election-id",
        default="",
        help=f"name of the Lease (default: {LEASE_NAME}; with --shard NAME: {LEASE_NAME}-shard-NAME)",
    )
    p.add_argument(
        "--shard",
        default=None,
        metavar="NAME",
        help="reconcile only ServeGraphs labelled servegraph.io/shard=NAME (one operator Deployment per shard)",
    )
    p.add_argument(
        "--shard-default",
        action="store_true",
        help="reconcile only ServeGraphs without the servegraph.io/shard label (the main instance beside shards)",
    )
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
        help="comma-separated host globs graphs may be downloaded from ('*': any host; empty is refused)",
    )
    p.add_argument(
        "--allowed-source-networks",
        default="",
        metavar="CIDRS",
        help="comma-separated exceptions to the refused networks, e.g. 127.0.0.0/8 for a registry on loopback "
        "(never link-local or cloud metadata)",
    )
    p.add_argument(
        "--denied-source-networks",
        default="",
        metavar="CIDRS",
        help="comma-separated networks refused too (the Service range, when the operator cannot list ServiceCIDRs)",
    )
    p.add_argument(
        "--allow-insecure-http-sources",
        action="store_true",
        help="let a ServeGraph's allowInsecureHTTP download over plain http:// (default: refused, whatever it says)",
    )
    _limit_arguments(p, "--max-graph-bytes", "--max-fetch-seconds")
    p.add_argument(
        "--fetches-per-namespace",
        type=int,
        default=2,
        help="downloads at once from one namespace's ServeGraphs; downloads run beside the workers, never in them",
    )
    p.add_argument(
        "--max-downloads",
        type=int,
        default=64,
        help="downloads at once in all (each holds up to --max-graph-bytes), shared by namespace in turn",
    )
    p.add_argument(
        "--parse-workers",
        type=int,
        default=0,
        help="graph parse processes, shared by namespace in turn (default: the CPU limit, at least 2, at most 4)",
    )
    p.add_argument(
        "--allow-serve-service-types",
        default="",
        metavar="TYPES",
        help="comma-separated Service types a ServeGraph's serveService may have besides ClusterIP: "
        "NodePort, LoadBalancer (default: none)",
    )
    p.add_argument(
        "--allow-serve-service-annotations",
        default="",
        metavar="PREFIXES",
        help="comma-separated prefixes of the annotations a ServeGraph's serveService may carry, "
        "e.g. prometheus.io/ (default: none: controllers act on a Service's annotations)",
    )
    p.add_argument(
        "--allow-gateway-classes",
        default="",
        metavar="CLASSES",
        help="comma-separated GatewayClasses a ServeGraph's clusterUpgradeOptions.gatewayClassName may name "
        "(KubeRay creates a Gateway of it for the incremental upgrade; default: none)",
    )
    p.add_argument(
        "--allow-gateways",
        default="",
        metavar="GATEWAYS",
        help="comma-separated Gateways a ServeGraph's spec.expose may attach its HTTPRoute to, as namespace/name "
        "(namespace/*: every Gateway of that namespace; default: none)",
    )
    p.add_argument(
        "--prometheus-url",
        default=None,
        metavar="URL",
        help="Prometheus' HTTP API, where a canary's evidence is read (the routers' per-version metrics); "
        "default: the routers' own counters, read through each RayService's serve Service",
    )
    p.add_argument(
        "--metrics-auth",
        choices=["none", "kubernetes"],
        default="none",
        help="kubernetes: /metrics answers only bearer tokens the API server authenticates (TokenReview) and "
        "authorizes for get on /metrics (SubjectAccessReview); the shipped manifests set it",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=run)

    f = command(
        subparsers,
        "fetch",
        help="download a graph exactly as the operator would; print its version and digest",
        examples=[
            "servegraph fetch https://registry.example.com/v1/graphs/fraud --token-file token",
            "servegraph fetch URL --token-file token --ca-file ca.pem --output fraud.pb",
        ],
    )
    f.add_argument("url")
    f.add_argument("--token-file", type=Path, required=True, help="file holding the bearer token")
    f.add_argument("--ca-file", type=Path, help="PEM CA bundle to verify the registry with (default: system CAs)")
    f.add_argument("--allow-host", action="append", default=[], metavar="GLOB", help="allowed host (repeatable)")
    f.add_argument("--allow-network", action="append", default=[], metavar="CIDR", help="refused-network exception")
    f.add_argument("--deny-network", action="append", default=[], metavar="CIDR", help="network refused too")
    f.add_argument("--kubeconfig", help="also refuse what the operator refuses in this cluster (API server, Services)")
    f.add_argument("--context", help="the kubeconfig context to use (default: its current-context)")
    f.add_argument("--timeout", type=float, default=30.0, help="seconds for the whole download (spec.source.timeout)")
    f.add_argument("--max-bytes", type=int, default=16 * MiB, help="size limit (spec.source.maxBytes, default 16 MiB)")
    _limit_arguments(f, "--max-graph-bytes", "--max-fetch-seconds")
    f.add_argument(
        "--allow-insecure-http",
        action="store_true",
        help="allow http:// (what allowInsecureHTTP does under the operator's --allow-insecure-http-sources)",
    )
    f.add_argument("--output", type=Path, metavar="FILE", help="write the downloaded bytes here")
    f.add_argument("-v", "--verbose", action="store_true", help="also print what only an administrator may see")
    f.set_defaults(func=fetch)


def _limit_arguments(p: argparse.ArgumentParser, max_bytes: str, max_seconds: str) -> None:
    p.add_argument(
        max_bytes,
        type=int,
        default=MAX_GRAPH_BYTES,
        help="ceiling on any ServeGraph's maxBytes (the operator's memory; larger graphs render RayServices the API server refuses)",
    )
    p.add_argument(max_seconds, type=float, default=60.0, help="ceiling on one download: every hop, retry and backoff")
    p.add_argument(
        "--min-source-rate",
        type=int,
        default=16 * 1024,
        metavar="BYTES_PER_S",
        help="a registry sending its body slower than this on average (after 5 s) is cut (TooSlow); 0: no floor",
    )


def _split(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def run(args: argparse.Namespace) -> int:
    with needs_extra("operator"):
        import kopf

        import servegraph.operator.run.handlers  # noqa: F401 - registers the handlers
        from servegraph.operator import secrets, serve_service
        from servegraph.operator.gateways import GatewayPolicy, parse_classes, parse_gateways
        from servegraph.operator.run import kopf_settings
        from servegraph.operator.run.app import Options
        from servegraph.operator.run.sharding import Shard
        from servegraph.source import Limits, SourcePolicy

    registry = kopf.get_default_registry()
    try:
        kopf_settings.refuse_change_handlers(registry)
    except RuntimeError as exc:
        raise SystemExit(f"servegraph run: {exc}") from None
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    if args.context:  # said at once in one line, not by kopf's login retrying
        from servegraph.cli import kubeconfig
        from servegraph.operator.run import login

        kubeconfig.check_files(args.kubeconfig, args.context)
        try:
            asyncio.run(login.at_context(args.kubeconfig, args.context))
        except kopf.LoginError as exc:
            raise Failure(f"servegraph run: {exc}", EXIT_UNREACHABLE) from None
    host, _, port = args.health_address.rpartition(":")
    events_host, _, events_port = args.events_address.rpartition(":")
    secret = secrets.from_flag(args.events_token_secret, key="token")
    if args.events_address and secret is None:
        raise SystemExit("servegraph run: --events-address needs --events-token-secret NAMESPACE/NAME")
    hosts = _split(args.allowed_source_hosts)
    if not hosts:
        raise SystemExit("servegraph run: --allowed-source-hosts is empty: name the registry hosts, or '*' for any")
    try:
        policy = SourcePolicy.build(
            hosts,
            _split(args.allowed_source_networks),
            _split(args.denied_source_networks),
            allow_insecure_http=args.allow_insecure_http_sources,
        )
    except ValueError as exc:
        raise SystemExit(f"servegraph run: {exc}") from None
    try:
        serve_service_types = serve_service.parse_types(args.allow_serve_service_types)
        serve_service_annotations = serve_service.parse_annotation_prefixes(args.allow_serve_service_annotations)
        gateways = GatewayPolicy(parse_classes(args.allow_gateway_classes), parse_gateways(args.allow_gateways))
    except ValueError as exc:
        raise SystemExit(f"servegraph run: {exc}") from None
    try:
        shard = Shard.from_flags(args.shard, args.shard_default)
    except ValueError as exc:
        raise SystemExit(f"servegraph run: {exc}") from None
    if args.parse_workers < 0:
        raise SystemExit("servegraph run: --parse-workers must be 1 or more (0: from the CPU limit)")
    options = Options(
        kubeconfig=args.kubeconfig,
        context=args.context,
        workers=args.workers,
        health_host=host,
        health_port=int(port),
        leader_elect=args.leader_elect,
        lease_namespace=args.leader_election_namespace,
        lease_name=args.leader_election_id or shard.lease_name(LEASE_NAME),
        shard=shard,
        events_host=events_host if args.events_address else None,
        events_port=int(events_port or 0),
        events_token_secret=secret,
        policy=policy,
        limits=Limits(
            max_bytes=args.max_graph_bytes, deadline_s=args.max_fetch_seconds, min_bytes_per_s=args.min_source_rate
        ),
        fetches_per_namespace=args.fetches_per_namespace,
        max_downloads=args.max_downloads,
        serve_service_types=serve_service_types,
        serve_service_annotations=serve_service_annotations,
        gateways=gateways,
        parse_workers=args.parse_workers,
        metrics_auth=args.metrics_auth == "kubernetes",
        prometheus_url=args.prometheus_url,
        namespaces=tuple(args.namespace) or None,
    )
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat.PLAIN)
    logging.getLogger("servegraph").setLevel(logging.INFO)
    if not args.verbose:
        # kopf logs every handler call at INFO; our own log has one line per transition.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    memo = kopf.Memo(options=options)
    namespaces = args.namespace or None
    asyncio.run(
        kopf.operator(
            registry=registry,
            clusterwide=namespaces is None,
            namespaces=namespaces or (),
            standalone=True,
            memo=memo,
        )
    )
    return 0


def fetch(args: argparse.Namespace) -> int:
    """One download under the operator's rules; exit 0 with a summary, 3 if the download
    failed (the operator's Fetched message), 2 if the graph is invalid (GraphValid's)."""
    with needs_extra("operator"):
        from servegraph.source import SourcePolicy

    token = _text(args.token_file)
    ca_pem = _text(args.ca_file) if args.ca_file else None
    try:
        policy = SourcePolicy.build(
            args.allow_host or ["*"],
            args.allow_network,
            args.deny_network,
            allow_insecure_http=args.allow_insecure_http,  # the administrator's own tool: their word
        )
    except ValueError as exc:
        raise SystemExit(f"servegraph fetch: {exc}") from None
    return asyncio.run(_fetch(args, policy, token, ca_pem))


def _text(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise Failure(f"error: {path}: not UTF-8 text", EXIT_INVALID) from None


async def _fetch(args: argparse.Namespace, policy: Any, token: str, ca_pem: str | None) -> int:
    from servegraph.graph import GraphError, parse_graph
    from servegraph.source import FetchError, FetchRequest, Limits, RegistryClient

    if args.kubeconfig or args.context:
        from servegraph.cli import kubeconfig
        from servegraph.kube import KubeClient
        from servegraph.operator.run.app import cluster_policy

        args.namespace = "default"  # not used: the cluster's addresses are not per namespace
        async with kubeconfig.cluster(args, "fetch") as found:
            policy = await cluster_policy(policy, KubeClient(found.api))
    limits = Limits(
        max_bytes=args.max_graph_bytes, deadline_s=args.max_fetch_seconds, min_bytes_per_s=args.min_source_rate
    )
    timeout_s, max_bytes = limits.clamp(args.timeout, args.max_bytes)
    request = FetchRequest(
        url=args.url,
        token=token,
        timeout_s=timeout_s,
        max_bytes=max_bytes,
        ca_pem=ca_pem,
        allow_insecure_http=args.allow_insecure_http,
        min_bytes_per_s=limits.min_bytes_per_s,
        rate_grace_s=limits.rate_grace_s,
    )
    async with RegistryClient(policy) as client:
        try:
            got = await client.fetch(request)
        except FetchError as exc:
            print(f"error: {exc.reason}: {exc}", file=sys.stderr)
            if args.verbose and exc.detail != str(exc):
                print(f"detail: {exc.detail}", file=sys.stderr)
            return EXIT_FETCH_FAILED
    if args.output:
        args.output.write_bytes(got.body)
    try:
        graph = await asyncio.to_thread(parse_graph, got.body, max_bytes=max_bytes)
    except GraphError:
        print(f"{got.url}: downloaded {len(got.body)} bytes, sha256 {got.digest}, ETag {got.etag}", file=sys.stderr)
        raise
    print(
        f"{got.url}: graph {graph.name!r} version {graph.version!r} sha256 {got.digest} "
        f"({len(got.body)} bytes, {len(graph.applications)} applications, {graph.node_count} nodes, ETag {got.etag})"
    )
    return 0
