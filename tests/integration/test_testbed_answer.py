"""The node tier's `answer`: a request lost on its way is sent again, a response is not.

Against a real local HTTP server, so the losses are the ones aiohttp really raises."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from servegraph_testbed.node.routes import answer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Serve = Callable[[Handler], Awaitable[str]]
NEVER = asyncio.Event()  # what a handler that never answers waits on; set at teardown


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    runners: list[web.AppRunner] = []
    NEVER.clear()

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_post("/embed", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}/embed"

    yield start
    NEVER.set()
    for runner in runners:
        await runner.cleanup()


async def test_a_request_dropped_without_a_response_is_sent_again(serve: Serve) -> None:
    seen: list[object] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(await request.json())
        if len(seen) == 1:
            assert request.transport is not None
            request.transport.close()  # the first request: the connection dies unanswered
        return web.json_response({"embedding": [1.0]})

    url = await serve(handler)
    lost: list[str] = []
    assert await answer(url, {"text": "x"}, within=10, lost=lost) == (200, {"embedding": [1.0]})
    assert seen == [{"text": "x"}, {"text": "x"}]
    assert len(lost) == 1 and "ServerDisconnectedError" in lost[0], lost


async def test_a_request_left_without_an_answer_is_sent_again_after_its_limit(
    serve: Serve,
) -> None:
    calls = 0

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal calls
        calls += 1
        if calls == 1:
            await NEVER.wait()
        return web.json_response({"n": calls})

    lost: list[str] = []
    assert await answer(await serve(handler), {}, within=10, lost=lost, limit_s=0.5) == (200, {"n": 2})
    assert len(lost) == 1 and "TimeoutError" in lost[0], lost


async def test_an_error_response_is_returned_at_once_not_retried(serve: Serve) -> None:
    calls = 0

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal calls
        calls += 1
        return web.Response(status=503, text="no replicas")

    lost: list[str] = []
    assert await answer(await serve(handler), {}, within=10, lost=lost) == (503, "no replicas")
    assert calls == 1 and lost == []


async def test_no_response_within_the_budget_fails_naming_the_url_and_the_losses(
    serve: Serve,
) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        await NEVER.wait()
        return web.Response()

    url = await serve(handler)
    with pytest.raises(AssertionError) as failure:
        await answer(url, {}, within=1.5, limit_s=0.5)
    assert url in str(failure.value) and "TimeoutError" in str(failure.value)
