"""A rollout's canary, with its I/O: what runs where, what the cluster says, what serving did.

`rollout/canary.py` decides (pure); this module gathers what it decides from and lays out
what then runs (docs/rollouts.md, "Canaries"):

- the **layout** the render stage builds (values.Layout): the base build, the live version
  beside it, the canary with its split, a retiring version kept while its requests drain;
  `status.layout` records the base and live digests, so a new leader lays out the same;
- at a canary's **start**, whether the version can be one: render/canary_plan.py's refusals
  (an ingress that would need a copy, applications added or removed...), and a Ray cluster
  change (another worker group shape, image or Ray version): those roll out whole, and the
  status says why;
- the **facts**: the canary's copies RUNNING or failed (KubeRay reports each side
  application), the evidence when a check is due (Prometheus, or the routers' own counters,
  `servegraph.evidence`), and `servegraph promote|abort` (the `servegraph.io/canary` annotation).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from servegraph.dag.model import Graph
from servegraph.evidence import Evidence, EvidenceError, Reader, Request
from servegraph.graph import GraphError
from servegraph.graph.workers import plan_worker_groups
from servegraph.names import CANARY_ANNOTATION
from servegraph.operator.conditions import parse_rfc3339
from servegraph.operator.kuberay import FAILED_APP_STATES, RUNNING, Live
from servegraph.operator.rollout import canary
from servegraph.operator.rollout.canary import CANARY_RUNS
from servegraph.operator.spec import ServeGraphSpec
from servegraph.operator.values import GoodGraph, Layout
from servegraph.render.canary import CanaryRefused, Refusal, Split, layout, plan_config, read, side_app
from servegraph.render.canary_plan import ready
from servegraph.render.rayservice import worker_pod_shape
from servegraph.render.serve_config import render_serve_config

log = logging.getLogger("servegraph.operator")


@dataclass(frozen=True)
class Versions:
    """The graphs a layout is built from, as the status names them (`status.layout`)."""

    base: GoodGraph | None
    live: GoodGraph | None


def stats_token(uid: str, digest: str) -> str:
    """The routers' stats token of one canary: the same for every reconcile (the render is
    byte-stable), another for every ServeGraph and version. Whoever reads the RayService
    reads it too: it guards counts, not secrets."""
    return hashlib.sha256(f"servegraph-stats\0{uid}\0{digest}".encode()).hexdigest()[:32]


def target_layout(
    spec: ServeGraphSpec,
    rollout: Mapping[str, Any] | None,
    target: GoodGraph,
    versions: Versions,
    retiring: GoodGraph | None,
    uid: str,
) -> Layout:
    """What to render for the decision: the canary beside the live version while it runs, the
    promoted one beside the base until its rollout completes, the live one beside the base
    after an abort; a version whose side applications drain (`rollout.retiring`) is kept
    meanwhile. Else the target built whole (ready for a canary when the spec has one)."""
    state = (rollout or {}).get("canary") or {}
    progressing = (rollout or {}).get("phase") == "Progressing"
    base, live = versions.base, versions.live
    retire = _beside(base, retiring) if base is not None and progressing else None
    if base is not None and progressing and state.get("phase") in CANARY_RUNS:
        c = spec.rollout.canary
        split = Split(
            int(state.get("weight") or 0),
            int(state.get("mirror") or 0),
            c.sticky_header if c else None,
            c.sticky_field if c else None,
            stats_token(uid, target.digest),
        )
        return Layout(base, _beside(base, live), target, split, retiring=retire, ready=True)
    if base is not None and progressing and state.get("phase") == canary.PROMOTED:
        return Layout(base, _beside(base, target), retiring=retire, ready=True)
    if base is not None and live is not None and target.digest == live.digest:
        beside = _beside(base, live)
        ready_ = spec.rollout.canary is not None or beside is not None or retire is not None
        return Layout(base, beside, retiring=retire, ready=ready_)
    return Layout(target, ready=spec.rollout.canary is not None)


def _ready_config(graph: Graph) -> dict[str, Any]:
    return ready(render_serve_config(graph))


def laid_out(
    base: Graph,
    live: Graph | None,
    canary: Graph | None,
    split: Split | None,
    retiring: Graph | None = None,
) -> dict[str, Any]:
    """The Serve config of the layout (render.canary.layout; CanaryRefused when a version cannot
    run beside the base)."""
    base_config = _ready_config(base)
    keep: list[dict[str, Any]] = []
    if retiring is not None:
        drained = layout(base_config, _ready_config(retiring), None, None)
        keep = [a for a in drained["applications"] if side_app(a["name"]) is not None]
    return layout(
        base_config,
        None if live is None else _ready_config(live),
        None if canary is None else _ready_config(canary),
        split,
        keep=keep,
    )


def _beside(base: GoodGraph, version: GoodGraph | None) -> GoodGraph | None:
    return None if version is None or version.digest == base.digest else version


async def refusal(spec: ServeGraphSpec, base: Graph, live: Graph | None, new: Graph) -> str | None:
    """Why `new` cannot be canaried beside the base and the live version: a layout refusal,
    or a Ray cluster change (those roll out whole: KubeRay's upgrade, not a canary)."""
    base_config = ready(render_serve_config(base))
    planned = plan_config(base_config, ready(render_serve_config(new)))
    if isinstance(planned, Refusal):
        return f"{planned.reason}: {planned.message}"
    serving = live or base
    if (new.cluster, new.labels) != (serving.cluster, serving.labels):
        return "ClusterChanged: it changes the Ray cluster's hints (image, Ray version, worker groups or labels)"
    shape = worker_pod_shape(spec.ray_service.workers.resources)
    try:
        before = {_shape(p) for p in plan_worker_groups(serving, shape)}
        after = {_shape(p) for p in plan_worker_groups(new, shape)}
    except GraphError as exc:
        return f"PodsTooSmall: {exc}"
    if not after <= before:
        return "ClusterChanged: it needs a worker group the running Ray cluster does not have (another pod shape)"
    try:
        layout(
            base_config,
            None if live is None else ready(render_serve_config(live)),
            ready(render_serve_config(new)),
            None,
        )
    except CanaryRefused as exc:
        return f"{exc.refusal.reason}: {exc.refusal.message}"
    return None


def _shape(p: Any) -> tuple[Any, ...]:
    return (p.name, p.cpus, p.gpus, p.memory_bytes, p.custom_resources, p.accelerator_type, p.node_selector)


def copies(state_config: Mapping[str, Any], live: Live | None) -> tuple[bool | None, str]:
    """Whether the canary's side applications run, as KubeRay reports them: True every one
    RUNNING (KubeRay having acted on the spec), False one failed (why), None not yet."""
    if live is None or not live.settled:
        return None, ""
    sides = sorted({roles["canary"] for roles in read(state_config).side_apps.values() if "canary" in roles})
    for name in sides:
        app = live.applications.get(name) or {}
        if app.get("status") in FAILED_APP_STATES:
            failing = [f"{d}: {x.get('message') or x.get('status')}" for d, x in (app.get("deployments") or {}).items()]
            return False, f"{name}: {app.get('status')}: {app.get('message') or '; '.join(failing)}"[:1024]
    if all((live.applications.get(name) or {}).get("status") == RUNNING for name in sides):
        return True, ""
    return None, ""


def action(annotations: Mapping[str, str], state: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """`promote` or `abort` asked for by `servegraph promote|abort` and not acted on yet."""
    value = annotations.get(CANARY_ANNOTATION)
    if not value or value == state.get("actionSeen"):
        return None, None
    verb = value.split("@", 1)[0]
    return (verb, value) if verb in (canary.PROMOTE, canary.ABORT) else (None, None)


async def evidence(reader: Reader | None, request: Request) -> tuple[Evidence | None, str]:
    """The evidence of the window, or why none could be read (no verdict is made then)."""
    if reader is None:
        return None, "no evidence reader"
    try:
        return await reader.read_canary(request), ""
    except EvidenceError as exc:
        log.info("canary evidence unavailable for %s/%s: %s", request.namespace, request.rayservice, exc)
        return None, str(exc)


def request(
    namespace: str,
    rayservice: str,
    state: Mapping[str, Any],
    live: GoodGraph,
    new: Graph,
    digest: str,
    uid: str,
    now: float,
) -> Request:
    """What the evidence is read for: this step's window, named by its start."""
    started = state["stepStartedAt"]
    return Request(
        namespace=namespace,
        rayservice=rayservice,
        graph=new.name,
        live_version=live.version,
        canary_version=new.version,
        window=f"{namespace}/{rayservice}/{digest}/{started}",
        window_s=max(1.0, now - parse_rfc3339(started)),
        applications={n: a.name for a in new.applications for n in a.nodes},
        routes={a.name: a.route_prefix for a in new.applications},
        token=stats_token(uid, digest),
    )
