"""Calling a graph's route on the node: one POST (`ask`), or the first response with a lost
request sent again (`answer`).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp


async def ask(url: str, payload: Any, limit_s: float = 10.0) -> tuple[int, Any]:
    """POST a JSON payload to a graph route: (status, decoded body or text).

    The connect timeout is short: on this node a connection is set up in milliseconds, or
    in about 1 s when kube-proxy drops its first SYN (TCP retries at 1 s and 3 s); one still
    not set up after 5 s is lost, and waiting out the whole `limit_s` on it only hides that.
    """
    timeout = aiohttp.ClientTimeout(total=limit_s, sock_connect=min(5.0, limit_s))
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(url, json=payload) as resp,
    ):
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text


async def answer(
    url: str, payload: Any, within: float = 90.0, lost: list[str] | None = None, limit_s: float = 15.0
) -> tuple[int, Any]:
    """The graph's first response to `payload`, sending again a request lost on its way.

    A connection made in the instant a Service's first endpoint becomes ready can be
    dropped inside the node, TCP's resends with it (docs/testenv.md, "Requests right
    after Ready"), and KubeRay reports Ready in about that instant. So a lost request
    (refused, never connected, no response in `limit_s`) is sent again on a new
    connection, as any client of a Service should, and each loss is appended to `lost`
    for the test to report. Any HTTP response is returned at once, whatever its status:
    a wrong answer is the caller's to judge.
    """
    losses = lost if lost is not None else []
    started = time.monotonic()
    while True:
        try:
            return await ask(url, payload, limit_s=limit_s)
        except (aiohttp.ClientError, TimeoutError) as e:
            losses.append(f"+{time.monotonic() - started:.1f}s {type(e).__name__}")
            if time.monotonic() - started > within:
                raise AssertionError(f"no response from {url} within {within:.0f} s: {losses}") from e
        await asyncio.sleep(1)
