"""Waiting on the API server by watch, for the operator bench: polling lists of thousands of
objects would load the API server during the operator's run only."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from typing import Any

from kubernetes_asyncio import client, watch

Done = Callable[[dict[str, Any]], str | None]
"""The key (`namespace/name`) an object's state completes, or None."""


def key_of(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace')}/{meta['name']}"


def applied(obj: dict[str, Any]) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Applied" and c["status"] == "True" for c in conditions)


async def current_version(api: Any, group: str, version: str, plural: str) -> str:
    """The collection's resourceVersion now, read with a one-item list (not the whole list)."""
    listed = await client.CustomObjectsApi(api).list_cluster_custom_object(group, version, plural, limit=1)
    return str(listed["metadata"]["resourceVersion"])


async def watch_until(
    api: Any,
    group: str,
    version: str,
    plural: str,
    done: Done,
    wanted: Collection[str],
    within: float,
    *,
    start: float,
    resource_version: str | None = None,
) -> dict[str, float]:
    """Seconds from `start` at which each wanted key was first seen done, cluster-wide.

    From `resource_version` only changes after it count; without, objects that exist
    already count too. Returns what was seen when `within` runs out (the caller decides
    whether a missing key is an error).
    """
    custom = client.CustomObjectsApi(api)
    wanted = set(wanted)
    seen: dict[str, float] = {}
    rv = resource_version
    try:
        async with asyncio.timeout(within):
            while not wanted <= seen.keys():
                kwargs: dict[str, Any] = {"timeout_seconds": 300, "allow_watch_bookmarks": True}
                if rv:
                    kwargs["resource_version"] = rv
                async with watch.Watch() as w:
                    stream = w.stream(custom.list_cluster_custom_object, group, version, plural, **kwargs)
                    async for event in stream:
                        obj = event["object"]
                        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                        if event["type"] == "BOOKMARK":
                            continue
                        key = done(obj)
                        if key is not None and key in wanted and key not in seen:
                            seen[key] = time.monotonic() - start
                        if wanted <= seen.keys():
                            w.stop()
                            break
    except TimeoutError:
        pass
    return seen
