"""GraphService for user code at the ingress, so every graph answers gRPC, not only routed ones.

Routers implement `Call` and `Stream` themselves (`router.py`). A user class at the
ingress gets them from a subclass made here: over gRPC it is called the way a router
would call it — `__call__(payload)`, plus `headers=` when it declares that keyword —
since there is no HTTP request to hand it. Over HTTP nothing changes: the subclass
adds methods, it overrides none. A function at the ingress first becomes a class whose
`__call__` is the function (Serve calls a function deployment for every method, gRPC
ones included, which would hand it the request message). A class that defines `Call`
or `Stream` itself (a user's own servicer) is left alone.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from servegraph.runtime.calls import failure_body
from servegraph.runtime.payload import Headers, Limits, PayloadRefused, collect


def with_graph_service(cls: Any, node_id: str, takes_headers: bool) -> Any:
    """`cls` with GraphService's `Call` and `Stream`, or `cls` itself when it has its own."""
    if inspect.isfunction(cls):
        cls = as_class(cls)
    if not inspect.isclass(cls) or hasattr(cls, "Call") or hasattr(cls, "Stream"):
        return cls

    async def Call(self: Any, request: Any, grpc_context: Any = None) -> Any:
        from servegraph.runtime import grpcwire

        limits = Limits.from_env()
        try:
            payload, headers = grpcwire.unpack(request, limits, grpc_context)
            result = _invoke(self, payload, headers, takes_headers)
            if inspect.isasyncgen(result) or inspect.isgenerator(result):
                async with aclosing(_async(result)) as items:
                    return grpcwire.result(await collect(items, limits))
            return grpcwire.result(await result if inspect.isawaitable(result) else result)
        except PayloadRefused as e:
            return grpcwire.refused(e, grpc_context)
        except Exception as e:
            return grpcwire.failed(failure_body(e, node_id))

    async def Stream(self: Any, request: Any, grpc_context: Any = None) -> AsyncGenerator[Any, None]:
        from servegraph.runtime import grpcwire

        try:
            payload, headers = grpcwire.unpack(request, Limits.from_env(), grpc_context)
        except PayloadRefused as e:
            yield grpcwire.stream_refused(e, grpc_context)
            return
        try:
            result = _invoke(self, payload, headers, takes_headers)
            if inspect.isasyncgen(result):
                async for item in result:
                    yield grpcwire.item(item)
            elif inspect.isgenerator(result):
                for item in result:
                    yield grpcwire.item(item)
            else:
                yield grpcwire.item(await result if inspect.isawaitable(result) else result)
        except Exception as e:
            yield grpcwire.stream_failed(failure_body(e, node_id))

    # Not named after a module attribute, so Ray pickles the subclass by value with its base.
    return type(cls.__name__, (cls,), {"Call": Call, "Stream": Stream, "__doc__": cls.__doc__})


async def _async(items: Any) -> AsyncGenerator[Any, None]:
    """A generator, sync or async, as an async one that closes it when it is closed."""
    if inspect.isasyncgen(items):
        async with aclosing(items):
            async for item in items:
                yield item
    else:
        try:
            for item in items:
                yield item
        finally:
            items.close()


def _invoke(instance: Any, payload: Any, headers: Headers, takes_headers: bool) -> Any:
    return instance(payload, headers=headers) if takes_headers else instance(payload)


def as_class(fn: Any) -> type:
    """A class whose `__call__` is `fn`, of the same kind (async, generator, ...), so Serve
    calls it exactly as it called the function."""
    if inspect.isasyncgenfunction(fn):

        async def agen(self: Any, *args: Any, **kwargs: Any) -> Any:
            async for item in fn(*args, **kwargs):
                yield item

        call: Any = agen
    elif inspect.iscoroutinefunction(fn):

        async def coro(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await fn(*args, **kwargs)

        call = coro
    elif inspect.isgeneratorfunction(fn):

        def gen(self: Any, *args: Any, **kwargs: Any) -> Any:
            yield from fn(*args, **kwargs)

        call = gen
    else:

        def plain(self: Any, *args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        call = plain
    call.__signature__ = inspect.signature(fn)  # what `takes_headers` reads stays the function's
    return type(fn.__name__, (), {"__call__": call, "__doc__": fn.__doc__})
