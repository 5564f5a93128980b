"""One router → child call: the handle call itself, its timeout per attempt and its retries.

A child that times out (after its retries) raises `NodeTimeout` naming it, through any
number of routers above it: the ingress answers 504 and says which node it was. The
call is cancelled in the child as well (best effort, as `DeploymentResponse.cancel`),
so a cut branch stops using its replica.

A streaming child is called with `stream=True` (`invoke_stream`): the edge's timeout
bounds the wait for the first item and each wait between items, a failure is retried
only before the first item (after it, items have gone downstream), and a consumer that
stops early (a client that went away) cancels the child's generator.

What a caller is told of a failure is the node and the error's type, never its message
(`describe`): an exception's text is whatever user code put there, a connection string
with its password as likely as anything. The message goes to the replica's log
(`logged`), where the router that turns the failure into an answer writes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

from servegraph.dag.model import DEFAULT_CALL, Call
from servegraph.runtime.choice import Choice
from servegraph.runtime.payload import Headers

logger = logging.getLogger("ray.serve")


@dataclass(frozen=True)
class Child:
    """A router's child: its node id, its handle, and how it is called.

    `handle` is a bound Application while building; Serve swaps it for a
    DeploymentHandle before the router's constructor runs. `router` children are
    called with `route(payload, headers)`; user code with its payload alone, plus
    `headers=` (the forwarded ones) when its `__call__` declares that keyword. A switch
    or splitter child carries its `choice`: the router calling it decides and calls the
    chosen grandchild itself (`choice.py`).
    """

    id: str
    handle: Any
    router: bool
    call: Call = DEFAULT_CALL
    takes_headers: bool = False
    streams: bool = False
    choice: Choice | None = None


class NodeTimeout(Exception):
    """A node did not answer within its edge's `timeout_s`, on any of its attempts.

    Not a TimeoutError: a router must tell its own edge's timeout apart from one that
    happened further down and reached it through a handle.
    """

    def __init__(self, node: str, timeout_s: float, attempts: int) -> None:
        self.node = node
        self.timeout_s = timeout_s
        self.attempts = attempts
        tries = "" if attempts == 1 else f" on each of {attempts} attempts"
        super().__init__(f'node "{node}" timed out after {timeout_s:g} s{tries}')

    def __reduce__(self) -> tuple[Any, ...]:
        # Raised in one replica, re-raised in another: Ray pickles it on the way.
        return (NodeTimeout, (self.node, self.timeout_s, self.attempts))

    def body(self) -> dict[str, Any]:
        """What the response (or an optional ensemble member's entry) says about it."""
        return {"error": str(self), "node": self.node, "timed_out": True}


class NodeFailed(Exception):
    """A node raised while streaming: the error item names it, whichever router reports it."""

    def __init__(self, node: str, reason: str) -> None:
        self.node = node
        self.reason = reason
        super().__init__(f'node "{node}" failed: {reason}')

    def __reduce__(self) -> tuple[Any, ...]:
        return (NodeFailed, (self.node, self.reason))

    def body(self) -> dict[str, Any]:
        # From the fields, not str(self): Ray re-raises it as a RayTaskError subclass whose text
        # is the remote traceback.
        return {"error": f'node "{self.node}" failed: {self.reason}', "node": self.node, "timed_out": False}


def failed_of(exc: BaseException) -> NodeFailed | None:
    """The NodeFailed in `exc` (itself or the cause Ray wrapped), as a plain NodeFailed."""
    for candidate in (exc, getattr(exc, "cause", None)):
        if isinstance(candidate, NodeFailed):
            return NodeFailed(candidate.node, candidate.reason)
    return None


def failure_body(exc: BaseException, fallback_node: str) -> dict[str, Any]:
    """What a client is told about `exc`: the node that failed or timed out, and the error's type."""
    known = timeout_of(exc) or failed_of(exc)
    return (known or NodeFailed(fallback_node, logged(exc, fallback_node))).body()


def describe(exc: BaseException) -> str:
    """The type of what user code raised (Ray wraps it): all a caller is told of it."""
    cause = getattr(exc, "cause", None) or exc
    return type(cause).__name__


def logged(exc: BaseException, node: str) -> str:
    """`describe(exc)`, after writing its message to this replica's log for the administrator."""
    cause = getattr(exc, "cause", None) or exc
    logger.warning('servegraph node "%s" failed: %s: %s', node, type(cause).__name__, cause)
    return describe(exc)


def timeout_of(exc: BaseException) -> NodeTimeout | None:
    """The NodeTimeout in `exc`: itself, or the cause Ray wrapped it in (RayTaskError)."""
    for candidate in (exc, getattr(exc, "cause", None)):
        if isinstance(candidate, NodeTimeout):
            return NodeTimeout(candidate.node, candidate.timeout_s, candidate.attempts)
    return None


Observer = Callable[[str, str], None]
"""Told (node, reason) of each failed attempt that is retried."""

Opener = Callable[[Child, Any, Headers, Headers], Any]
"""Starts one attempt of a call: (child, payload, headers, user headers) → an awaitable
response with `cancel()`, or for a stream an object with `__anext__` and `cancel()`.
A handle call by default; the caller's own choice for a `Child.choice`."""


async def invoke(
    child: Child,
    payload: Any,
    headers: Headers,
    user_headers: Headers,
    retried: Observer | None = None,
    opener: Opener | None = None,
) -> Any:
    """Call `child` with its timeout and retries; the last attempt's failure propagates.

    `headers` go to routers (all of the request's, for header switches at any depth),
    `user_headers` to user code that asks for them.
    """
    call = child.call
    attempts = call.retries + 1
    for attempt in range(1, attempts + 1):
        try:
            response = (opener or _call_handle)(child, payload, headers, user_headers)
            return await _attempt(response, call.timeout_s)
        except Exception as e:
            reason = _retry_reason(child, e, attempt, attempts)
        if retried is not None:
            retried(child.id, reason)
    raise AssertionError("unreachable")


class _AttemptTimedOut(Exception):
    """This edge's own timeout fired (as opposed to a NodeTimeout from further down)."""


def _retry_reason(child: Child, exc: Exception, attempt: int, attempts: int) -> str:
    """Why the failed `attempt` is retried; after the last one, what the caller gets instead."""
    if isinstance(exc, _AttemptTimedOut):
        assert child.call.timeout_s is not None
        if attempt == attempts:
            raise NodeTimeout(child.id, child.call.timeout_s, attempts) from None
        return "timeout"
    if attempt == attempts:
        raise exc
    return "error"


def _call_handle(child: Child, payload: Any, headers: Headers, user_headers: Headers) -> Any:
    if child.router:
        return child.handle.options(method_name="route").remote(payload, headers)
    if child.takes_headers:
        return child.handle.remote(payload, headers=user_headers)
    return child.handle.remote(payload)


async def _attempt(response: Any, timeout_s: float | None) -> Any:
    if timeout_s is None:
        return await response
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline:
            return await response
    except TimeoutError:
        if not deadline.expired():
            raise  # the child's own TimeoutError, not this edge's deadline
        cancel = getattr(response, "cancel", None)
        if cancel is not None:
            cancel()
        raise _AttemptTimedOut from None


async def invoke_stream(
    child: Child,
    payload: Any,
    headers: Headers,
    user_headers: Headers,
    retried: Observer | None = None,
    opener: Opener | None = None,
) -> AsyncGenerator[Any, None]:
    """Call a streaming `child`: its items as they come (see the module docstring)."""
    call = child.call
    attempts = call.retries + 1
    for attempt in range(1, attempts + 1):
        stream = (opener or _open_stream)(child, payload, headers, user_headers)
        finished = False
        try:
            try:
                first = await _next_item(stream, call.timeout_s)
            except StopAsyncIteration:
                finished = True
                return
            except Exception as e:
                reason = _retry_reason(child, e, attempt, attempts)
            else:
                yield first
                while True:
                    try:
                        item = await _next_item(stream, call.timeout_s)
                    except StopAsyncIteration:
                        finished = True
                        return
                    except _AttemptTimedOut:
                        assert call.timeout_s is not None
                        raise NodeTimeout(child.id, call.timeout_s, attempt) from None
                    yield item
        finally:
            if not finished:
                stream.cancel()
        if retried is not None:
            retried(child.id, reason)


def _open_stream(child: Child, payload: Any, headers: Headers, user_headers: Headers) -> Any:
    if child.router:
        return child.handle.options(method_name="stream", stream=True).remote(payload, headers)
    handle = child.handle.options(stream=True)
    return handle.remote(payload, headers=user_headers) if child.takes_headers else handle.remote(payload)


async def _next_item(stream: Any, timeout_s: float | None) -> Any:
    if timeout_s is None:
        return await stream.__anext__()
    deadline = asyncio.timeout(timeout_s)
    try:
        async with deadline:
            return await stream.__anext__()
    except TimeoutError:
        if not deadline.expired():
            raise
        raise _AttemptTimedOut from None
