"""Field paths of server-side apply, as the stand-in API server (memory_api) tracks them.

A path is a tuple of the elements managedFields' fieldsV1 spells: `f:<name>` for a map
key or struct field, `k:{"uid":...}` for an element of a keyed list, `v:<json>` for an
element of a set. Which lists are keyed is the schema's business: the stand-in knows
ObjectMeta's two the operator and KubeRay write (ownerReferences keyed by uid, with
atomic elements; finalizers as a set) and treats every other list as atomic, one leaf,
where the real server also keys containers by name, ports by port and protocol and so
on. That differs only when two managers write elements of one list, which neither the
operator nor KubeRay does on a RayService or a ConfigMap.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping
from typing import Any

Path = tuple[str, ...]
OWNER_REFS: Path = ("f:metadata", "f:ownerReferences")
FINALIZERS: Path = ("f:metadata", "f:finalizers")
MISSING: Any = object()
"""What `value_at` answers for a path the object does not have."""

SERVER_METADATA = (
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
)
"""Metadata only the API server writes: an update keeps them as they are."""

SERVER_SET = frozenset(
    {("f:apiVersion",), ("f:kind",), ("f:status",)}
    | {("f:metadata", f"f:{name}") for name in ("name", "namespace", *SERVER_METADATA, "managedFields", "selfLink")}
)
"""What no field manager owns on the main resource (the API server sets it, or the status
subresource owns it); the status subresource's managers own only what is under `status`."""


def _element(path: Path, item: Any) -> str:
    if path == OWNER_REFS:
        return "k:" + json.dumps({"uid": item.get("uid")}, separators=(",", ":"))
    return "v:" + json.dumps(item, separators=(",", ":"))


def _keyed(path: Path) -> bool:
    return path in (OWNER_REFS, FINALIZERS)


def field_set(obj: Mapping[str, Any], status: bool = False) -> set[Path]:
    """Every leaf path `obj` sets (and every element of a keyed list): what applying it owns.

    `status`: the status subresource's fields instead of the main resource's.
    """
    out: set[Path] = set()
    if status:
        if "status" in obj:
            _walk(obj["status"], ("f:status",), out)
        return out
    _walk(obj, (), out)
    return {p for p in out if not any(p[: len(s)] == s for s in SERVER_SET)}


def _walk(value: Any, path: Path, out: set[Path]) -> None:
    if isinstance(value, dict) and value:
        for key, item in value.items():
            if item is not None:
                _walk(item, (*path, f"f:{key}"), out)
    elif isinstance(value, list) and value and _keyed(path):
        out.update((*path, _element(path, item)) for item in value)
    elif path:
        out.add(path)


def value_at(obj: Any, path: Path) -> Any:
    """The value at `path`, or MISSING."""
    at = obj
    for i, step in enumerate(path):
        if step.startswith("f:") and isinstance(at, dict) and step[2:] in at:
            at = at[step[2:]]
        elif isinstance(at, list) and _keyed(path[:i]):
            at = _find(at, path[:i], step)
        else:
            return MISSING
        if at is MISSING:
            return MISSING
    return at


def _find(items: list[Any], path: Path, step: str) -> Any:
    return next((item for item in items if _element(path, item) == step), MISSING)


def changed_paths(old: Mapping[str, Any] | None, new: Mapping[str, Any], status: bool = False) -> set[Path]:
    """What an update from `old` to `new` sets: changed leaves, and every map or keyed list it
    creates (fieldsV1's `.`), as the real server records an Update operation."""
    scope = field_set(new, status)
    out: set[Path] = set()
    _changes(old if old is not None else MISSING, new, (), out)
    return {p for p in out if any(s[: len(p)] == p for s in scope)}


def _changes(old: Any, new: Any, path: Path, out: set[Path]) -> None:
    if isinstance(new, dict) and new:
        if path and not isinstance(old, dict):
            out.add(path)
        for key, item in new.items():
            if item is not None:
                before = old.get(key, MISSING) if isinstance(old, dict) else MISSING
                _changes(before, item, (*path, f"f:{key}"), out)
    elif isinstance(new, list) and new and _keyed(path):
        if not isinstance(old, list):
            out.add(path)
        for item in new:
            step = _element(path, item)
            if not isinstance(old, list) or _find(old, path, step) != item:
                out.add((*path, step))
    elif old != new:
        out.add(path)


def merge(live: Any, config: Any, path: Path = ()) -> Any:
    """`config` laid over `live`: maps merge by key, keyed lists by element, other lists and
    scalars are replaced whole."""
    if isinstance(config, dict) and isinstance(live, dict):
        if not config:
            return copy.deepcopy(live)
        out = copy.deepcopy(live)
        for key, item in config.items():
            if item is not None:
                out[key] = merge(live[key], item, (*path, f"f:{key}")) if key in live else copy.deepcopy(item)
        return out
    if isinstance(config, list) and isinstance(live, list) and _keyed(path):
        merged = [copy.deepcopy(item) for item in live]
        steps = [_element(path, item) for item in live]
        for item in config:
            step = _element(path, item)
            if step in steps:
                merged[steps.index(step)] = copy.deepcopy(item)
            else:
                merged.append(copy.deepcopy(item))
        return merged
    return copy.deepcopy(config)


def remove(obj: dict[str, Any], paths: Iterable[Path]) -> None:
    """Remove `paths` from `obj` in place, and every map or list that removal leaves empty."""
    for path in sorted(paths, key=len, reverse=True):
        _remove(obj, path)


def _remove(obj: dict[str, Any], path: Path) -> None:
    parent = value_at(obj, path[:-1])
    step = path[-1]
    if isinstance(parent, dict) and step.startswith("f:"):
        parent.pop(step[2:], None)
    elif isinstance(parent, list):
        parent[:] = [item for item in parent if _element(path[:-1], item) != step]
    else:
        return
    if not parent and len(path) > 1:
        _remove(obj, path[:-1])


def parse(fields: Mapping[str, Any], prefix: Path = ()) -> set[Path]:
    """The paths a fieldsV1 tree names."""
    out: set[Path] = set()
    for step, inner in fields.items():
        if step == ".":
            out.add(prefix)
        elif inner:
            out |= parse(inner, (*prefix, step))
        else:
            out.add((*prefix, step))
    return out


def render(paths: Iterable[Path]) -> dict[str, Any]:
    """The fieldsV1 tree of `paths` (`.` marks a path that also has paths under it)."""
    tree: dict[str, Any] = {}
    ordered = sorted(set(paths), key=len, reverse=True)
    for path in ordered:
        node = tree
        for step in path:
            node = node.setdefault(step, {})
        if node:
            node["."] = {}
    return tree
