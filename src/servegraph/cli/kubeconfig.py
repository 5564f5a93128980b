"""How every command that talks to a cluster finds it, as kubectl does: `--kubeconfig`,
`--context`, `-n/--namespace` defaulting to the context's namespace; and what becomes
of a kubeconfig or an API server that fails: one line and exit 3, never a traceback.

Only the standard library at import time; the Kubernetes client loads when a command
runs, inside `needs_extra("operator")`.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servegraph.cli.common import EXIT_UNREACHABLE, Failure
from servegraph.extras import needs_extra

NAMESPACE_HELP = "namespace (default: the kubeconfig context's, else default)"


def add_arguments(p: Any, *, namespace: bool = True) -> None:
    """`-n/--namespace`, `--context` and `--kubeconfig` on a subcommand's parser."""
    if namespace:
        p.add_argument("-n", "--namespace", help=NAMESPACE_HELP)
    p.add_argument("--context", help="the kubeconfig context to use (default: its current-context)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or in-cluster)")


def check_files(kubeconfig: str | None, context: str | None, environ: Any = os.environ) -> None:
    """Refuse, in one line, a kubeconfig that cannot be read, before any client tries (and
    logs "Config not found" and raises from deep inside)."""
    if kubeconfig is not None:
        if not Path(kubeconfig).is_file():
            raise Failure(f"error: --kubeconfig {kubeconfig}: no such file", EXIT_UNREACHABLE)
        return
    listed = [p for p in (environ.get("KUBECONFIG") or "").split(os.pathsep) if p]
    if listed:
        if not any(Path(p).is_file() for p in listed):
            raise Failure(f"error: $KUBECONFIG names no file that exists ({', '.join(listed)})", EXIT_UNREACHABLE)
        return
    if (Path.home() / ".kube" / "config").is_file():
        return
    if context:
        raise Failure(f"error: --context {context}: no kubeconfig to find it in", EXIT_UNREACHABLE)
    if not environ.get("KUBERNETES_SERVICE_HOST"):
        raise Failure(
            "error: no kubeconfig: none given (--kubeconfig), $KUBECONFIG is unset, ~/.kube/config does not "
            "exist, and this is not a pod with a service account",
            EXIT_UNREACHABLE,
        )


@dataclass(frozen=True)
class Cluster:
    """A connected API client and the namespace a command works in."""

    api: Any
    namespace: str


@contextlib.asynccontextmanager
async def cluster(args: Any, command: str) -> AsyncIterator[Cluster]:
    """Connect as `args` say, resolve the namespace, close at the end; every failure of the
    kubeconfig or the API server on the way is a Failure naming it."""
    with needs_extra("operator"):
        from servegraph.kube import connect
        from servegraph.statustree.gather import default_namespace
    check_files(args.kubeconfig, args.context)
    with errors(command):
        namespace = args.namespace or default_namespace(args.kubeconfig, args.context)
        api = await connect(args.kubeconfig, args.context)
    try:
        with errors(command):
            yield Cluster(api, namespace)
    finally:
        await api.close()


@contextlib.contextmanager
def errors(command: str) -> Any:
    """The kubeconfig's and the API connection's exceptions as one line each (exit 3)."""
    import yaml
    from aiohttp import ClientError
    from kubernetes_asyncio.client.rest import ApiException
    from kubernetes_asyncio.config import ConfigException

    from servegraph.kube import KubeError

    # kubernetes_asyncio logs "Config not found" itself before raising: the error below says it.
    logging.getLogger("kubernetes_asyncio").setLevel(logging.CRITICAL)
    try:
        yield
    except ConfigException as exc:
        raise Failure(f"servegraph {command}: kubeconfig: {_first_line(exc)}", EXIT_UNREACHABLE) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise Failure(f"servegraph {command}: the kubeconfig is not YAML{at}", EXIT_UNREACHABLE) from None
    except ApiException as exc:
        raise Failure(
            f"servegraph {command}: the API server answered {exc.status} {exc.reason}", EXIT_UNREACHABLE
        ) from None
    except KubeError as exc:
        raise Failure(f"servegraph {command}: {exc}", EXIT_UNREACHABLE) from None
    except (ClientError, OSError, TimeoutError) as exc:
        what = _first_line(exc) or type(exc).__name__
        raise Failure(f"servegraph {command}: cannot reach the API server: {what}", EXIT_UNREACHABLE) from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0]
