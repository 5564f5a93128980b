"""A publish storm: a tenth of the tenants publish a new version at once.

Each new version is published to the registry, then announced the way a registry
would: a "graph published" CloudEvent per graph to the operator's `POST /v1/events`
(`via="events"`: 20 deliveries in flight, each retrying a 429 after its Retry-After
with jitter, as a webhook dispatcher does), or the refresh annotation written straight
on each ServeGraph (`via="annotation"`: the operator's reconcile alone, without the
endpoint). Measured from the moment publishing starts: when each RayService's spec hash
changes (publish → RayService updated) and when each ServeGraph reports the new digest
Applied (all applied).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from watching import applied, current_version, key_of, watch_until

from servegraph.names import (
    GROUP,
    PLURAL,
    RAY_GROUP,
    RAY_PLURAL,
    RAY_VERSION,
    REFRESH_ANNOTATION,
    SPEC_HASH_ANNOTATION,
    VERSION,
)
from servegraph.operator.run.events_endpoint import EVENT_TYPE
from servegraph_testbed.registry import Registry


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


async def spec_hashes(api: Any, keys: Sequence[str], concurrency: int) -> dict[str, str]:
    custom = client.CustomObjectsApi(api)
    sem = asyncio.Semaphore(concurrency)
    out: dict[str, str] = {}

    async def one(key: str) -> None:
        ns, name = key.split("/")
        async with sem:
            rs = await custom.get_namespaced_custom_object(RAY_GROUP, RAY_VERSION, ns, RAY_PLURAL, name)
        out[key] = rs["metadata"]["annotations"][SPEC_HASH_ANNOTATION]

    await asyncio.gather(*(one(k) for k in keys))
    return out


SENDERS = 20
"""Deliveries in flight at once, as a registry's webhook dispatcher has a pool of them."""


async def announce_events(port: int, token: str, urls: Sequence[str], seed: int) -> int:
    """One CloudEvent per URL, `SENDERS` at a time; the number of 429 answers retried."""
    throttled = 0
    jitter = random.Random(seed)
    senders = asyncio.Semaphore(SENDERS)
    endpoint = f"http://127.0.0.1:{port}/v1/events"
    headers = {"Content-Type": "application/cloudevents+json", "Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(i: int, url: str) -> None:
            nonlocal throttled
            event = {"specversion": "1.0", "type": EVENT_TYPE, "source": "https://registry.bench", "id": f"storm-{i}"}
            body = json.dumps({**event, "subject": url})
            async with senders:
                while True:
                    async with session.post(endpoint, data=body, headers=headers) as resp:
                        if resp.status == 202:
                            return
                        text = await resp.text()
                        if resp.status != 429:
                            raise RuntimeError(f"events endpoint answered {resp.status} for {url}: {text.strip()}")
                        throttled += 1
                        wait = float(resp.headers.get("Retry-After", "1"))
                    await asyncio.sleep(wait * (1 + jitter.random()))

        await asyncio.gather(*(one(i, u) for i, u in enumerate(urls)))
    return throttled


async def annotate(api: Any, keys: Sequence[str], concurrency: int) -> None:
    custom = client.CustomObjectsApi(api)
    sem = asyncio.Semaphore(concurrency)

    async def one(key: str) -> None:
        ns, name = key.split("/")
        patch = {"metadata": {"annotations": {REFRESH_ANNOTATION: f"storm-{time.time_ns()}"}}}
        async with sem:
            await custom.patch_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, name, patch, _content_type="application/merge-patch+json"
            )

    await asyncio.gather(*(one(k) for k in keys))


async def run_storm(
    api: Any,
    registry: Registry,
    publish: Mapping[str, tuple[str, bytes]],
    urls: Mapping[str, str],
    *,
    via: str,
    events_port: int,
    events_token: str,
    concurrency: int,
    within: float,
    seed: int,
) -> dict[str, Any]:
    """`publish`: ServeGraph key → (registry graph name, new bytes). The storm's figures."""
    keys = sorted(publish)
    before = await spec_hashes(api, keys, concurrency)
    digests = {k: f"sha256:{hashlib.sha256(data).hexdigest()}" for k, (_, data) in publish.items()}

    def rayservice_updated(obj: dict[str, Any]) -> str | None:
        key = key_of(obj)
        annotations = obj["metadata"].get("annotations") or {}
        old = before.get(key)
        return key if old is not None and annotations.get(SPEC_HASH_ANNOTATION) != old else None

    def servegraph_applied(obj: dict[str, Any]) -> str | None:
        key = key_of(obj)
        graph = (obj.get("status") or {}).get("graph") or {}
        return key if key in digests and graph.get("digest") == digests[key] and applied(obj) else None

    rs_rv = await current_version(api, RAY_GROUP, RAY_VERSION, RAY_PLURAL)
    sg_rv = await current_version(api, GROUP, VERSION, PLURAL)
    start = time.monotonic()
    watches = (
        asyncio.create_task(
            watch_until(api, RAY_GROUP, RAY_VERSION, RAY_PLURAL, rayservice_updated, keys, within,
                        start=start, resource_version=rs_rv)
        ),
        asyncio.create_task(
            watch_until(api, GROUP, VERSION, PLURAL, servegraph_applied, keys, within,
                        start=start, resource_version=sg_rv)
        ),
    )  # fmt: skip
    try:
        for name, data in publish.values():
            registry.publish(name, data)
        throttled = 0
        if via == "events":
            throttled = await announce_events(events_port, events_token, [urls[k] for k in keys], seed)
        else:
            await annotate(api, keys, concurrency)
        announced_s = time.monotonic() - start
        updated, done = await asyncio.gather(*watches)
    finally:
        for task in watches:
            task.cancel()
    latencies = list(updated.values())
    return {
        "via": via,
        "graphs": len(keys),
        "announced_s": announced_s,
        "throttled_429": throttled,
        "rayservices_updated": len(updated),
        "applied": len(done),
        "p50_s": percentile(latencies, 0.5) if latencies else None,
        "p99_s": percentile(latencies, 0.99) if latencies else None,
        "max_s": max(latencies) if latencies else None,
        "all_applied_s": max(done.values()) if len(done) == len(keys) else None,
    }
