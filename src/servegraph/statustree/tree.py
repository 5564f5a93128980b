"""A ServeGraph drawn as its graph (pure): what `servegraph status` prints.

The shape comes from the RayService's serveConfigV2 — the args the runtime builds
from, decoded by the runtime's own codec — so the tree is what is deployed, not what
a registry says now. Each node gets its deployment state as KubeRay mirrored it into
the ServeGraph's status, its replicas (running/target from Ray Serve when reachable,
else what the config asks for) and how its caller calls it; around the tree, what
`kubectl describe` would say: the live graph, the last rollout, the conditions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, assert_never

from servegraph.dag.args import BuildError, decode, decode_side, refs
from servegraph.dag.model import (
    Call,
    DeploymentKind,
    EnsembleKind,
    Node,
    SequenceKind,
    SplitterKind,
    SwitchKind,
)
from servegraph.dag.streams import streaming_outputs
from servegraph.dag.text import call_text, kind_label
from servegraph.names import ConditionType
from servegraph.render.serve_text import read_config
from servegraph.statustree import pods
from servegraph.statustree.age import age
from servegraph.statustree.canary import canary_lines

HISTORY_SHOWN = 5


@dataclass(frozen=True)
class Snapshot:
    """Everything the tree is drawn from, as the API server (and Ray Serve) returned it."""

    servegraph: Mapping[str, Any]
    rayservice: Mapping[str, Any] | None = None
    events: Sequence[Mapping[str, Any]] = ()
    serve: Mapping[str, Any] | None = None
    """Ray Serve's `GET /api/serve/applications/` of the active cluster, when it could be read."""
    serve_note: str | None = None
    """Why there are no live replica counts (not asked, unreachable, refused)."""
    rayclusters: Sequence[Mapping[str, Any]] = ()
    """The RayService's Ray clusters (active and pending), as KubeRay keeps them now."""
    pods: Sequence[Mapping[str, Any]] = ()
    """Their pods."""
    ray_note: str | None = None
    """Why the Ray clusters or their pods could not be read (the caller may not read them)."""


def render(snap: Snapshot, now: datetime) -> str:
    sg = snap.servegraph
    meta, status = sg.get("metadata") or {}, sg.get("status") or {}
    lines = [f"Name:          {meta.get('name', '')}", f"Namespace:     {meta.get('namespace', '')}"]
    ready = _condition(status, ConditionType.READY)
    if ready:
        lines.append(
            f"Ready:         {ready.get('status')}  {ready.get('reason', '')}  "
            f"(since {age(ready.get('lastTransitionTime'), now)})  {ready.get('message', '')}".rstrip()
        )
    graph = status.get("graph") or {}
    if graph:
        lines.append(
            f"Graph:         {graph.get('name')}  version {graph.get('version')!r}  {graph.get('digest', '')}  "
            f"({_count(graph.get('applications'), 'application')}, {_count(graph.get('nodes'), 'node')})"
        )
    else:
        lines.append("Graph:         none applied yet")
    rs = snap.rayservice
    cluster = ((rs or {}).get("status") or {}).get("activeServiceStatus", {}).get("rayClusterName")
    rs_name = status.get("rayServiceName")
    lines.append(f"RayService:    {rs_name or '-'}" + (f"  (Ray cluster {cluster})" if cluster else ""))
    clusters = {str((c.get("metadata") or {}).get("name")): c for c in snap.rayclusters}
    if cluster and (problem := pods.cluster_facts(clusters.get(cluster))[1]):
        lines.append(f"               ! {problem}")
    rollout = status.get("rollout")
    if rollout:
        lines.append(f"Rollout:       {rollout_line(rollout, now)}")
        lines += canary_lines(rollout, now)
    else:
        lines.append(f"Last rollout:  {last_rollout(snap.events, now)}")
    lines += upgrade_lines(status.get("upgrade"))
    lines += pending_lines(status.get("pending"), clusters)
    lines += ["Conditions:", *_conditions(status, now)]
    stuck = pods.lines(snap.pods)
    if stuck:
        lines += ["Ray pods not running:", *(f"  {line}" for line in stuck)]
    elif snap.ray_note:
        lines.append(f"Ray pods:      not read: {snap.ray_note}")
    history = status.get("history") or []
    if history:
        lines += ["History:", *_history(history, now)]
    lines.append("Graph as deployed:")
    lines += graph_tree(snap)
    return "\n".join(lines) + "\n"


def _count(n: Any, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def upgrade_lines(upgrade: Mapping[str, Any] | None) -> list[str]:
    """KubeRay's new-cluster upgrade (status.upgrade); with the incremental one, where each
    cluster's share of the requests and target capacity stand, and a rollback."""
    if not upgrade:
        return []
    apps = ", ".join(f"{a}: {s}" for a, s in (upgrade.get("applications") or {}).items()) or "starting"
    new = upgrade.get("pendingRayCluster") or "(pending)"
    old = upgrade.get("activeRayCluster") or "the active cluster"
    shares = upgrade.get("incremental")
    if not shares:
        return [f"Upgrade:       Ray cluster {new} ({apps}); {old} serves the previous version"]
    what = "rolling back to" if upgrade.get("rollingBack") else "incremental, from"
    out = [f"Upgrade:       Ray cluster {new} ({apps}); {what} {old}"]
    for cluster, share in ((new, shares.get("pending") or {}), (old, shares.get("active") or {})):
        routed, capacity = share.get("trafficRoutedPercent"), share.get("targetCapacity")
        out.append(
            f"  {cluster}: {'?' if routed is None else routed} % of requests, "
            f"target capacity {'?' if capacity is None else capacity} %"
            + (f", moved {share['lastTrafficMigratedTime']}" if share.get("lastTrafficMigratedTime") else "")
        )
    return out


def pending_lines(pending: Mapping[str, Any] | None, clusters: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The Ray cluster KubeRay is starting (status.pending): how far it got, and its problem, as
    KubeRay keeps the RayCluster now."""
    if not pending:
        return []
    name = str(pending.get("rayClusterName", ""))
    facts, problem = pods.cluster_facts(clusters.get(name))
    out = [f"Starting:      Ray cluster {name}" + (f" ({', '.join(facts)})" if facts else "") + ", not serving yet"]
    if problem:
        out.append(f"               ! {problem}")
    return out


def rollout_line(rollout: Mapping[str, Any], now: datetime) -> str:
    """status.rollout in one line: which version, how it stands, why it started."""
    text = f"version {rollout.get('version')!r} {rollout.get('phase', '')}"
    if rollout.get("cause") == "rollback":
        text += f" (rolling back from {str(rollout.get('from', ''))[:12]})"
    elif rollout.get("cause") == "pin":
        text += " (pinned)"
    text += f", started {age(rollout.get('startedAt'), now)} ago"
    if rollout.get("readyAt"):
        text += f", Ready {age(rollout['readyAt'], now)} ago"
    if rollout.get("message"):
        text += f": {rollout['message']}"
    return text


def _history(history: Sequence[Mapping[str, Any]], now: datetime) -> list[str]:
    rows = [
        (
            repr(h.get("version")),
            h.get("outcome", ""),
            str(h.get("digest", ""))[:12],
            age(h.get("appliedAt"), now),
            age(h.get("readyAt"), now) if h.get("readyAt") else "-",
            (_cluster_note(h) + str(h.get("message") or ""))[:100],
        )
        for h in history[:HISTORY_SHOWN]
    ]
    return _table([("VERSION", "OUTCOME", "DIGEST", "APPLIED", "READY", "MESSAGE"), *rows], indent="  ")


def _cluster_note(entry: Mapping[str, Any]) -> str:
    """`Ray cluster X rolled back at 25 %: ` for a version whose new cluster KubeRay rolled back."""
    cluster = entry.get("rayCluster") or {}
    if cluster.get("outcome") != "RolledBack":
        return ""
    peak = cluster.get("peakTrafficPercent")
    return f"Ray cluster {cluster.get('name', '')} rolled back" + (f" at {peak} %" if peak else "") + ": "


def last_rollout(events: Sequence[Mapping[str, Any]], now: datetime) -> str:
    """The newest `Applied` Event the operator posted: when and what it applied."""
    applied = [e for e in events if e.get("reason") == "Applied"]
    if not applied:
        return "none recorded (Events expire after an hour by default)"
    event = max(applied, key=_event_time)
    return f"{age(_event_time(event), now)} ago: {event.get('message', '')}"


def _event_time(event: Mapping[str, Any]) -> str:
    meta = event.get("metadata") or {}
    return str(event.get("lastTimestamp") or event.get("eventTime") or meta.get("creationTimestamp") or "")


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    found: Mapping[str, Any] = next((c for c in status.get("conditions") or () if c.get("type") == kind), {})
    return found


def _conditions(status: Mapping[str, Any], now: datetime) -> list[str]:
    rows = [
        (c["type"], c.get("status", ""), c.get("reason", ""), age(c.get("lastTransitionTime"), now), c.get("message"))
        for kind in ConditionType
        if (c := _condition(status, kind))
    ]
    return _table([("TYPE", "STATUS", "REASON", "AGE", "MESSAGE"), *rows], indent="  ") if rows else ["  none yet"]


def _table(rows: Sequence[Sequence[Any]], indent: str = "") -> list[str]:
    cells = [[str(c) if c is not None else "" for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    return [(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))).rstrip() for r in cells]


# -- the graph ------------------------------------------------------------------------


@dataclass(frozen=True)
class _App:
    name: str
    route: str
    ingress: str
    nodes: Mapping[str, Node]
    options: Mapping[str, Mapping[str, Any]]
    """The Serve config's deployment options by node id (replicas)."""
    streaming: frozenset[str] = frozenset()
    """Nodes whose output streams."""


def graph_tree(snap: Snapshot) -> list[str]:
    config_text = ((snap.rayservice or {}).get("spec") or {}).get("serveConfigV2")
    if not config_text:
        return ["  no RayService (or no serveConfigV2) yet"]
    out: list[str] = []
    if snap.serve is None and snap.serve_note:
        out.append(f"  (replicas: what the config asks for; live counts unavailable: {snap.serve_note})")
    status = snap.servegraph.get("status") or {}
    status_apps = status.get("applications") or {}
    # serveConfigV2 is what a cluster KubeRay is starting deploys: its statuses, when reported, are this config's.
    pending = status.get("pending") or {}
    serve_apps = (snap.serve or {}).get("applications") or {}
    for raw in (read_config(config_text) or {}).get("applications") or []:
        name = str(raw.get("name", ""))
        starting = name in (pending.get("applications") or {})
        app_status = (pending["applications"] if starting else status_apps).get(name) or {}
        where = f"  (on Ray cluster {pending.get('rayClusterName', '')}, starting)" if starting else ""
        out.append(f"{name}  {raw.get('route_prefix', '')}  {app_status.get('status', 'NOT REPORTED')}{where}")
        if app_status.get("message"):
            out.append(f"  ! {_one_line(app_status['message'])}")
        options = {str(d.get("name")): d for d in raw.get("deployments") or [] if isinstance(d, Mapping)}
        live = {} if starting else serve_apps.get(name) or {}  # the active cluster's replicas are not these
        if "side" in (raw.get("args") or {}):
            out += _side_rows(name, raw.get("args") or {}, options, app_status, live)
            continue
        try:
            decoded = decode(raw.get("args") or {})
        except BuildError as exc:
            out.append(f"  cannot read the graph from serveConfigV2: {exc.problems[0]}")
            continue
        nodes = {n.id: n for n in decoded.nodes}
        streaming = streaming_outputs({i: n.kind for i, n in nodes.items()}, nodes)
        app = _App(name, raw.get("route_prefix", ""), decoded.ingress, nodes, options, streaming)
        rows: list[tuple[str, ...]] = [("NODE", "KIND", "STATE", "REPLICAS", "")]
        notes: list[tuple[int, str]] = []
        _walk(app, app.ingress, "", "", None, set(), rows, notes, app_status, live)
        table = _table(rows, indent="  ")
        for i, line in enumerate(table):
            out.append(line)
            out.extend(f"  {' ' * 4}! {note}" for at, note in notes if at == i)
    return out


def _side_rows(
    name: str,
    args: Mapping[str, Any],
    options: Mapping[str, Mapping[str, Any]],
    app_status: Mapping[str, Any],
    live: Mapping[str, Any],
) -> list[str]:
    """A canary's side application: its version's copies of the nodes that differ from the
    base's (the rest of its graph is the base application's own deployments)."""
    try:
        side = decode_side(args)
    except BuildError as exc:
        return [f"  cannot read the canary's copies from serveConfigV2: {exc.problems[0]}"]
    nodes = {n.id: n for n in side.nodes}
    app = _App(name, "", side.roots[0] if side.roots else "", nodes, options, frozenset())
    rows: list[tuple[str, ...]] = [("NODE", "KIND", "STATE", "REPLICAS", "")]
    for node_id in sorted(side.copies):
        deployment = (app_status.get("deployments") or {}).get(node_id) or {}
        state = deployment.get("status", "")
        note = _one_line(deployment["message"]) if deployment.get("message") and state != "HEALTHY" else ""
        rows.append((node_id, kind_label(nodes[node_id].kind, False), state, _replicas(app, node_id, live), note))
    return [f"  copies of application {side.app}'s nodes, as a canary's version has them:", *_table(rows, "  ")]


def _walk(
    app: _App,
    node_id: str,
    prefix: str,
    branch: str,
    label: str | None,
    seen: set[str],
    rows: list[tuple[str, ...]],
    notes: list[tuple[int, str]],
    app_status: Mapping[str, Any],
    serve_app: Mapping[str, Any],
) -> None:
    node = app.nodes.get(node_id)
    title = f"{prefix}{branch}{node_id}" + (f" {label}" if label else "")
    if node is None:
        rows.append((title, "?", "", "", "not in the deployed config"))
        return
    if node_id in seen:
        rows.append((title, kind_label(node.kind, node_id in app.streaming), "", "", "(shown above)"))
        return
    seen.add(node_id)
    deployment = (app_status.get("deployments") or {}).get(node_id) or {}
    state = deployment.get("status", "")
    rows.append((title, kind_label(node.kind, node_id in app.streaming), state, _replicas(app, node_id, serve_app), ""))
    if deployment.get("message") and state != "HEALTHY":
        notes.append((len(rows) - 1, _one_line(deployment["message"])))
    children = _children(node)
    for i, (child, child_label, call) in enumerate(children):
        last = i == len(children) - 1
        options = call_text(call) if call is not None else ""
        full_label = " ".join(x for x in (child_label, f"({options})" if options else "") if x) or None
        deeper = prefix + ("" if not branch else ("   " if branch == "└─ " else "│  "))
        _walk(app, child, deeper, "└─ " if last else "├─ ", full_label, seen, rows, notes, app_status, serve_app)


def _children(node: Node) -> list[tuple[str, str, Call | None]]:
    """(child id, what the edge is, its call options) in the order the node calls them."""
    kind = node.kind
    if isinstance(kind, DeploymentKind):
        return [(ref, "(handle)", None) for _, ref in refs(kind)]
    labels: list[str]
    match kind:
        case SequenceKind():
            labels = [f"[step {i + 1}]" for i in range(len(kind.steps))]
        case EnsembleKind():
            labels = ["[member]"] * len(kind.members) + (["[combiner]"] if kind.combiner else [])
        case SwitchKind():
            labels = [f"[= {equals!r}]" for equals, _ in kind.cases] + ["[default]"]
        case SplitterKind():
            labels = [f"[{weight}%]" for _, weight in kind.routes]
        case _:
            assert_never(kind)
    return [(ref, labels[i], kind.call(i)) for i, (_, ref) in enumerate(refs(kind))]


def _replicas(app: _App, node_id: str, serve_app: Mapping[str, Any]) -> str:
    """`running/target` from Ray Serve, else `want N` (or `want min..max`) from the config."""
    live = (serve_app.get("deployments") or {}).get(node_id)
    if isinstance(live, Mapping):
        running = sum(1 for r in live.get("replicas") or () if (r or {}).get("state") == "RUNNING")
        return f"{running}/{live.get('target_num_replicas', '?')} running"
    options = app.options.get(node_id) or {}
    auto = options.get("autoscaling_config")
    if isinstance(auto, Mapping):
        return f"want {auto.get('min_replicas')}..{auto.get('max_replicas')}"
    return f"want {options.get('num_replicas', 1)}"


def _one_line(text: Any, limit: int = 240) -> str:
    """A message on one line, its head and tail when long: Ray's headline says what failed, its
    end why (the exception; the resources a replica wants and those available)."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit * 2 // 3] + " … " + line[-(limit // 3 - 3) :]
