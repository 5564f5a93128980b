"""How the stand-in API server (memory_api) changes an object on a write, field manager by field manager.

Server-side apply as the real server does it (tests/integration/test_api_contract.py
holds the two to the same scenarios): the applied fields are merged over the live
object, fields only other managers own are kept, a field this manager applied before
and now omits is removed unless someone else owns it too, and a field another manager
owns with a different value is a conflict (409) unless forced, which takes it over. An
update (a hand edit, KubeRay's status write) owns the fields it changes, taking them
from whoever owned them. Ownership is kept in metadata.managedFields as fieldsV1.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from memory_fields import MISSING, Path, changed_paths, field_set, merge, parse, remove, render, value_at

from servegraph.kube import KubeError

Defaults = Callable[[dict[str, Any]], None]
"""Fills in what the resource's schema defaults, in place (what the server does to every write)."""


def no_defaults(obj: dict[str, Any]) -> None:
    """A ConfigMap's: none."""


@dataclass
class Entry:
    """One managedFields entry, its fieldsV1 as a set of paths."""

    manager: str
    operation: str
    api_version: str
    subresource: str | None
    fields: set[Path]


def entries(obj: Mapping[str, Any]) -> list[Entry]:
    """The object's managers. An entry without fieldsV1 (an object a test wrote as it stands)
    owns every field of its part (main resource or status) that the object has."""
    out = []
    for raw in (obj.get("metadata") or {}).get("managedFields") or ():
        sub = raw.get("subresource")
        fields = parse(raw["fieldsV1"]) if "fieldsV1" in raw else field_set(obj, status=sub == "status")
        version = raw.get("apiVersion", obj.get("apiVersion", ""))
        out.append(Entry(raw["manager"], raw.get("operation", "Update"), version, sub, fields))
    return out


def _store(obj: dict[str, Any], owners: list[Entry]) -> None:
    """Write `owners` back, less the paths `obj` no longer has and the managers left with none."""
    for e in owners:
        e.fields = {p for p in e.fields if value_at(obj, p) is not MISSING}
    kept = sorted((e for e in owners if e.fields), key=lambda e: (e.operation, e.subresource or "", e.manager))
    raw = []
    for e in kept:
        entry: dict[str, Any] = {"manager": e.manager, "operation": e.operation, "apiVersion": e.api_version}
        entry |= {"fieldsType": "FieldsV1", "fieldsV1": render(e.fields)}
        raw.append(entry | ({"subresource": e.subresource} if e.subresource else {}))
    meta = obj.setdefault("metadata", {})
    if raw:
        meta["managedFields"] = raw
    else:
        meta.pop("managedFields", None)


def _find(owners: list[Entry], manager: str, operation: str, subresource: str | None) -> Entry | None:
    return next(
        (e for e in owners if (e.manager, e.operation, e.subresource) == (manager, operation, subresource)), None
    )


def dotted(path: Path) -> str:
    """A path as the API server's conflict message spells it: `.spec.serveConfigV2`."""
    return "".join(f".{step[2:]}" if step.startswith("f:") else f"[{step[2:]}]" for step in path)


def _conflict_message(conflicts: list[tuple[Entry, Path]]) -> str:
    count = len(conflicts)
    managers = sorted({e.manager for e, _ in conflicts})
    fields = [dotted(p) for _, p in conflicts]
    if count == 1:
        return f'Apply failed with 1 conflict: conflict with "{managers[0]}": {fields[0]}'
    named = ", ".join(f'"{m}"' for m in managers)
    return f"Apply failed with {count} conflicts: conflicts with {named}:\n" + "\n".join(f"- {f}" for f in fields)


def apply(
    live: dict[str, Any] | None,
    manifest: Mapping[str, Any],
    manager: str,
    force: bool,
    defaults: Defaults = no_defaults,
) -> dict[str, Any]:
    """The object once `manager` applied `manifest` over `live` (None: it is created);
    raises KubeError Conflict when another manager owns an applied field with another value."""
    config = copy.deepcopy(dict(manifest))
    defaults(config)
    config.pop("status", None)  # the main resource's writes reset status: the subresource owns it
    for server_set in ("resourceVersion", "managedFields", "uid", "generation", "creationTimestamp"):
        config.get("metadata", {}).pop(server_set, None)
    applied = field_set(config)
    version = str(config.get("apiVersion", ""))
    if live is None:
        _store(config, [Entry(manager, "Apply", version, None, applied)])
        return config
    owners = entries(live)
    mine = _find(owners, manager, "Apply", None)
    conflicts = [
        (e, p)
        for e in owners
        if e is not mine and e.subresource is None
        for p in sorted(applied & e.fields)
        if value_at(live, p) != value_at(config, p)
    ]
    if conflicts and not force:
        raise KubeError("Conflict", _conflict_message(conflicts), 409)
    for e, p in conflicts:
        e.fields.discard(p)
    if mine is None:
        mine = Entry(manager, "Apply", version, None, set())
        owners.append(mine)
    obj: dict[str, Any] = merge(live, config)
    others = set().union(*(e.fields for e in owners if e is not mine))
    remove(obj, mine.fields - applied - others)
    mine.fields, mine.api_version = applied, version
    _store(obj, owners)
    return obj


def update(
    live: Mapping[str, Any] | None,
    new: Mapping[str, Any],
    manager: str,
    subresource: str | None = None,
    defaults: Defaults = no_defaults,
) -> dict[str, Any]:
    """The object once `manager` wrote `new` over `live` (an update: PUT or merge patch).

    `manager` owns what it changed, taken from whoever owned it. `live` None: a write by
    hand to an object the stand-in never stored, so `new`'s fields are all its own too.
    """
    status = subresource == "status"
    obj = copy.deepcopy(dict(new))
    defaults(obj)
    owners = entries(live if live is not None else new)
    if live is None:
        changed = field_set(obj, status)
    else:
        changed = changed_paths(live, obj, status)
        for e in owners:
            e.fields -= changed
    mine = _find(owners, manager, "Update", subresource)
    if mine is None:
        mine = Entry(manager, "Update", str(obj.get("apiVersion", "")), subresource, set())
        owners.append(mine)
    mine.fields |= changed
    _store(obj, owners)
    return obj


def merge_patch(obj: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386: maps merge, null removes, anything else replaces."""
    out = copy.deepcopy(dict(obj))
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_patch(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def httproute_defaults(obj: dict[str, Any]) -> None:
    """What the Gateway API's HTTPRoute schema (v1.4, standard) defaults in what the operator
    renders: a backend's group, kind and weight."""
    for rule in (obj.get("spec") or {}).get("rules") or ():
        for ref in rule.get("backendRefs") or ():
            ref.setdefault("group", "")
            ref.setdefault("kind", "Service")
            ref.setdefault("weight", 1)


def rayservice_defaults(obj: dict[str, Any]) -> None:
    """The defaults of KubeRay's RayService schema (1.7) that the operator's manifests meet:
    a worker group's numOfHosts and priority (1.7's autoscaler ordering; 1.6 has no such
    field), and a container's or the serve Service's port protocol."""
    spec = obj.get("spec") or {}
    cluster = spec.get("rayClusterConfig") or {}
    groups = [cluster.get("headGroupSpec") or {}, *(cluster.get("workerGroupSpecs") or ())]
    for group in cluster.get("workerGroupSpecs") or ():
        group.setdefault("numOfHosts", 1)
        group.setdefault("priority", 0)
    pod_specs = [((g.get("template") or {}).get("spec") or {}) for g in groups]
    for pod in pod_specs:
        for container in [*(pod.get("containers") or ()), *(pod.get("initContainers") or ())]:
            for port in container.get("ports") or ():
                port.setdefault("protocol", "TCP")
    for port in ((spec.get("serveService") or {}).get("spec") or {}).get("ports") or ():
        port.setdefault("protocol", "TCP")
