"""What `servegraph status` draws, as data (`-o json|yaml`, pure): for scripts and `jq`.

The same sources as the tree (`tree.py`): the ServeGraph's status, the graph as
deployed (decoded from the RayService's serveConfigV2 by the runtime's codec), each
node's state and replicas, and the Ray pods that are not running.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servegraph.dag.args import BuildError, decode
from servegraph.dag.streams import streaming_outputs
from servegraph.dag.text import call_text, kind_text
from servegraph.names import ConditionType
from servegraph.render.serve_text import read_config
from servegraph.statustree import pods
from servegraph.statustree.tree import Snapshot, _children


def document(snap: Snapshot) -> dict[str, Any]:
    sg = snap.servegraph
    meta, status = sg.get("metadata") or {}, sg.get("status") or {}
    rs_status = (snap.rayservice or {}).get("status") or {}
    ready = next((c for c in status.get("conditions") or () if c.get("type") == ConditionType.READY), None)
    return {
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "ready": ready,
        "graph": status.get("graph"),
        "rayService": {
            "name": status.get("rayServiceName"),
            "rayCluster": (rs_status.get("activeServiceStatus") or {}).get("rayClusterName"),
        },
        "rollout": status.get("rollout"),
        "upgrade": status.get("upgrade"),
        "pending": status.get("pending"),
        "conditions": status.get("conditions") or [],
        "history": status.get("history") or [],
        "applications": applications(snap),
        "rayPodsNotRunning": pods.lines(snap.pods),
        "notes": {"replicas": snap.serve_note, "rayPods": snap.ray_note},
    }


def applications(snap: Snapshot) -> list[dict[str, Any]]:
    """Each deployed application with its nodes in the order the runtime builds them."""
    text = ((snap.rayservice or {}).get("spec") or {}).get("serveConfigV2") or ""
    status = snap.servegraph.get("status") or {}
    pending = status.get("pending") or {}
    serve_apps = (snap.serve or {}).get("applications") or {}
    out = []
    for raw in (read_config(text) or {}).get("applications") or []:
        name = str(raw.get("name", ""))
        starting = name in (pending.get("applications") or {})
        app_status = ((pending.get("applications") if starting else status.get("applications")) or {}).get(name) or {}
        entry: dict[str, Any] = {
            "name": name,
            "routePrefix": raw.get("route_prefix"),
            "status": app_status.get("status"),
            "message": app_status.get("message"),
            "startingOn": pending.get("rayClusterName") if starting else None,
        }
        try:
            decoded = decode(raw.get("args") or {})
        except BuildError as exc:
            entry["problem"] = f"cannot read the graph from serveConfigV2: {exc.problems[0]}"
            out.append(entry)
            continue
        options = {str(d.get("name")): d for d in raw.get("deployments") or [] if isinstance(d, Mapping)}
        nodes = {n.id: n for n in decoded.nodes}
        streaming = streaming_outputs({i: n.kind for i, n in nodes.items()}, nodes)
        live = {} if starting else (serve_apps.get(name) or {}).get("deployments") or {}
        deployments = app_status.get("deployments") or {}
        entry["ingress"] = decoded.ingress
        entry["nodes"] = [
            {
                "id": node.id,
                "kind": kind_text(node.kind),
                "streams": node.id in streaming,
                "state": (deployments.get(node.id) or {}).get("status"),
                "message": (deployments.get(node.id) or {}).get("message"),
                "replicas": _replicas(options.get(node.id) or {}, live.get(node.id)),
                "calls": [
                    {"node": child, "as": label.strip("[]()"), "options": call_text(call) if call else None}
                    for child, label, call in _children(node)
                ],
            }
            for node in nodes.values()
        ]
        out.append(entry)
    return out


def _replicas(options: Mapping[str, Any], live: Any) -> dict[str, Any]:
    """Running and target from Ray Serve when it answered, else what the config asks for."""
    if isinstance(live, Mapping):
        running = sum(1 for r in live.get("replicas") or () if (r or {}).get("state") == "RUNNING")
        return {"running": running, "target": live.get("target_num_replicas")}
    auto = options.get("autoscaling_config")
    if isinstance(auto, Mapping):
        return {"min": auto.get("min_replicas"), "max": auto.get("max_replicas")}
    return {"want": options.get("num_replicas", 1)}
