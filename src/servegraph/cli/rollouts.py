"""`servegraph rollback` and `servegraph restart`: one merge patch on a ServeGraph each.

They talk to the cluster, with the `operator` extra; only the standard library at import
time, so the CLI lists both without it. `--dry-run` prints the patch and what it would do
(`--dry-run=server` also has the API server check it) and changes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
from collections.abc import Callable
from typing import Any

from servegraph.cli import kubeconfig
from servegraph.cli.common import EXIT_INVALID, EXIT_UNREACHABLE, Failure, command
from servegraph.extras import needs_extra
from servegraph.names import CANARY_ANNOTATION, GROUP, PLURAL, RESTARTED_AT_ANNOTATION, VERSION


def add_arguments(subparsers: Any) -> None:
    p = command(
        subparsers,
        "rollback",
        help="run an earlier version of a ServeGraph (pins it in spec.rollout.pin)",
        examples=[
            "servegraph rollback fraud -n team-a",
            "servegraph rollback fraud --to 3 --dry-run",
            "servegraph rollback fraud --clear",
        ],
    )
    p.add_argument("name", help="the ServeGraph")
    p.add_argument(
        "--to",
        metavar="VERSION|DIGEST",
        help="a version or (a prefix of) a digest in its history (default: the last Ready one before what runs)",
    )
    p.add_argument("--clear", action="store_true", help="remove the pin: follow the source again")
    dry_run_argument(p)
    kubeconfig.add_arguments(p)
    p.set_defaults(func=rollback)

    p = command(
        subparsers,
        "restart",
        help="roll a ServeGraph's Ray cluster without downtime (a new cluster, traffic moved when Ready)",
        examples=["servegraph restart fraud -n team-a", "servegraph restart fraud --dry-run"],
    )
    p.add_argument("name", help="the ServeGraph")
    dry_run_argument(p)
    kubeconfig.add_arguments(p)
    p.set_defaults(func=restart)


def dry_run_argument(p: Any) -> None:
    p.add_argument(
        "--dry-run",
        nargs="?",
        const="client",
        choices=("client", "server"),
        help="print the patch and what it would do, change nothing; =server: the API server checks it too",
    )


async def get_object(
    custom: Any, group: str, version: str, namespace: str, plural: str, name: str
) -> dict[str, Any] | None:
    """One object as a dict, None when it does not exist; Failure for any other answer."""
    from kubernetes_asyncio.client.rest import ApiException

    try:
        resp = await custom.get_namespaced_custom_object(
            group, version, namespace, plural, name, _preload_content=False
        )
        raw = await resp.read()
        status, reason = resp.status, resp.reason
    except ApiException as exc:
        status, reason, raw = exc.status, exc.reason, b""
    # Without preloading, the client raises for no HTTP status: a 404's body is a Status object.
    if status == 404:
        return None
    if not 200 <= status <= 299:
        raise Failure(f"servegraph: cannot read {plural} {namespace}/{name}: HTTP {status} {reason}", EXIT_UNREACHABLE)
    data: dict[str, Any] = json.loads(raw)
    return data


# ---- rollback --------------------------------------------------------------------------


def rollback(args: argparse.Namespace) -> int:
    return asyncio.run(_rollback(args))


async def _rollback(args: argparse.Namespace) -> int:
    def decide(body: dict[str, Any]) -> tuple[dict[str, Any], str]:
        if args.clear:
            return {"spec": {"rollout": {"pin": None}}}, "unpinned: it follows its source again"
        entry = choose_version(body.get("status") or {}, args.to)  # LookupError: refused
        patch = {"spec": {"rollout": {"pin": {"digest": f"sha256:{entry['digest']}"}}}}
        return (
            patch,
            f"pinned to version {entry['version']!r} ({entry['digest'][:12]}); `--clear` follows the source again",
        )

    return await _edit(args, "rollback", decide)


async def _edit(
    args: argparse.Namespace, command: str, decide: Callable[[dict[str, Any]], tuple[dict[str, Any], str]]
) -> int:
    """Read the ServeGraph, let `decide` turn it into a merge patch and what to print (or refuse
    it with a LookupError), and send the patch: what `rollback` and `restart` share."""
    with needs_extra("operator"):
        from kubernetes_asyncio import client
    async with kubeconfig.cluster(args, command) as kube:
        namespace = kube.namespace
        custom = client.CustomObjectsApi(kube.api)
        body = await get_object(custom, GROUP, VERSION, namespace, PLURAL, args.name)
        if body is None:
            raise Failure(f"servegraph {command}: ServeGraph {namespace}/{args.name} not found", EXIT_INVALID)
        try:
            patch, message = decide(body)
        except LookupError as exc:
            raise Failure(f"servegraph {command}: {exc}", EXIT_INVALID) from None
        if args.dry_run == "client":
            return _dry(namespace, args.name, patch, message, "")
        extra = {"dry_run": "All"} if args.dry_run == "server" else {}
        await custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            args.name,
            patch,
            _content_type="application/merge-patch+json",
            **extra,
        )
    if args.dry_run:
        return _dry(namespace, args.name, patch, message, ", the API server accepted it")
    print(f"ServeGraph {namespace}/{args.name} {message}")
    return 0


def _dry(namespace: str, name: str, patch: dict[str, Any], message: str, checked: str) -> int:
    print(f"dry run{checked}, nothing changed: ServeGraph {namespace}/{name} would be {message}")
    print(f"merge patch: {json.dumps(patch, sort_keys=True)}")
    return 0


def choose_version(status: dict[str, Any], wanted: str | None) -> dict[str, Any]:
    """The history entry to pin: the given version or digest, else the last Ready one
    before what runs now. LookupError says what the history holds."""
    history = status.get("history") or []
    current = (status.get("rollout") or {}).get("digest")
    if wanted:
        digest = wanted.removeprefix("sha256:")
        matches = [
            h for h in history if h["version"] == wanted or (len(digest) >= 7 and h["digest"].startswith(digest))
        ]
        unique = {h["digest"]: h for h in matches}
        if len(unique) == 1:
            entry: dict[str, Any] = next(iter(unique.values()))
            if not entry.get("rollbackAvailable", True):
                raise LookupError(f"version {entry['version']!r} is in the history but its graph was too large to keep")
            return entry
        if len(unique) > 1:
            raise LookupError(f"{wanted!r} matches several versions: {', '.join(sorted(unique))}")
    else:
        for entry in history:
            if entry["digest"] != current and entry.get("readyAt") and entry.get("rollbackAvailable", True):
                return dict(entry)
    known = ", ".join(f"{h['version']} ({h['digest'][:12]}, {h['outcome']})" for h in history) or "nothing"
    what = f"no version or digest {wanted!r}" if wanted else "no earlier Ready version"
    raise LookupError(f"{what} in the history; it holds: {known}")


# ---- restart ---------------------------------------------------------------------------


def restart(args: argparse.Namespace) -> int:
    return asyncio.run(_restart(args))


async def _restart(args: argparse.Namespace) -> int:
    def decide(body: dict[str, Any]) -> tuple[dict[str, Any], str]:
        refused = restart_refused(body.get("spec") or {})
        if refused:
            meta = body.get("metadata") or {}
            raise LookupError(f"ServeGraph {meta.get('namespace')}/{args.name}: {refused}")
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        # The uid test makes the patch fail rather than restart a ServeGraph created again meanwhile.
        patch = {"metadata": {"uid": body["metadata"]["uid"], "annotations": {RESTARTED_AT_ANNOTATION: now}}}
        return patch, (
            f"restarted ({RESTARTED_AT_ANNOTATION}={now}): KubeRay starts a new Ray cluster and moves traffic "
            "to it when it is Ready (`servegraph status` shows the upgrade)"
        )

    return await _edit(args, "restart", decide)


# ---- promote / abort a ServeGraph's canary -------------------------------------------------


def end_canary(args: argparse.Namespace, action: str) -> int:
    """`servegraph promote|abort NAME`: the operator ends the canary, once per annotation value."""
    return asyncio.run(_edit(args, action, lambda body: canary_patch(body, action)))


def canary_patch(body: dict[str, Any], action: str) -> tuple[dict[str, Any], str]:
    """The annotation that asks the operator to promote or abort; LookupError when no canary runs."""
    meta = body.get("metadata") or {}
    canary = ((body.get("status") or {}).get("rollout") or {}).get("canary") or {}
    if canary.get("phase") not in ("Deploying", "Mirroring", "Weighted"):
        what = f"its last canary is {canary['phase']}" if canary.get("phase") else "it has run none"
        raise LookupError(f"ServeGraph {meta.get('namespace')}/{meta.get('name')}: no canary runs ({what})")
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    patch = {"metadata": {"uid": meta["uid"], "annotations": {CANARY_ANNOTATION: f"{action}@{now}"}}}
    done = "the canary's version serves alone" if action == "promote" else "the canary is removed"
    return patch, f"asked to {action} ({CANARY_ANNOTATION}={action}@{now}): the operator acts, {done}"


def restart_refused(spec: dict[str, Any]) -> str | None:
    """Why a restart would do nothing, or None."""
    ray_service = spec.get("rayService") or {}
    if spec.get("suspend") or ray_service.get("suspend"):
        return "it is suspended (spec.suspend): no Ray cluster runs; resuming starts a new one"
    if ray_service.get("upgradeStrategy") == "None":
        return (
            "spec.rayService.upgradeStrategy is None: KubeRay never replaces a running Ray cluster; "
            "remove it (or set NewCluster) to restart without downtime"
        )
    return None
