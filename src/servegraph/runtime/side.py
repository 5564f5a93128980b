"""The builder of a side application: one version's copies, beside the base application.

A side application's args (`dag.args.SideArgs`) list its copies and every node below them.
The copies are bound here, in the side application; every other node is the base's,
reached by name (`serve.get_deployment_handle(node, app_name=base)`: a handle pickles as
its names, so a copy holds it like any other). Every copy answers `servegraph_call` and
`servegraph_stream` (routers have them; user code gets them from a subclass made here), which
is how a base router's redirected call reaches it whatever the new version's code takes
(`routing.py`). Serve deploys what the application's ingress reaches: the copies' single
root, or `HOLDER`, which binds every root and answers no traffic (the side application has
no route; its copies are called by the base's routers alone).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, Generator, Mapping
from typing import Any

from ray import serve
from ray.serve import Application

from servegraph.dag import streams
from servegraph.dag.args import HOLDER, BuildError, decode_side
from servegraph.dag.model import DeploymentKind
from servegraph.runtime.builder import Bind, Edges, as_deployment, bind_deployment, bind_router, resolve_import_path
from servegraph.runtime.builder import takes_headers as asks_headers
from servegraph.runtime.grpc_ingress import as_class
from servegraph.runtime.serve_internals import rebind
from servegraph.runtime.telemetry import GraphContext


class Holder:
    """Binds a side application's roots so Serve deploys them; answers no traffic."""

    def __init__(self, *roots: Any) -> None:
        self.roots = roots

    async def __call__(self, *args: Any, **kwargs: Any) -> dict[str, str]:
        return {"error": "this application holds a canary's copies; call the graph's own route"}


def build_side(args: Mapping[str, Any]) -> Application:
    """The side application's ingress: its copies bound, the base's nodes by name."""
    side = decode_side(args)
    context = GraphContext("", "", side.telemetry)
    kinds = {n.id: n.kind for n in side.nodes}
    order = [n.id for n in side.nodes]
    routers = {n.id for n in side.nodes if not isinstance(n.kind, DeploymentKind)}
    bound: dict[str, Any] = {}
    asks: set[str] = set()
    edges = Edges(bound, kinds, routers, asks, streams.streaming_outputs(kinds, order))
    pending: list[tuple[Application, Bind]] = []
    problems: list[str] = []
    for node in side.nodes:
        kind = node.kind
        try:
            if node.id not in side.copies:
                if isinstance(kind, DeploymentKind):
                    where = f'node "{node.id}", field deployment.import_path: {kind.import_path!r}'
                    target = as_deployment(node.id, resolve_import_path(kind.import_path, where), where).func_or_class
                    if asks_headers(target):
                        asks.add(node.id)
                bound[node.id] = serve.get_deployment_handle(node.id, app_name=side.app, _check_exists=False)
                continue
            if isinstance(kind, DeploymentKind):
                bind, takes = bind_deployment(node.id, kind, bound, ingress=False)
                if takes:
                    asks.add(node.id)
                bind = Bind(
                    bind.deployment.options(func_or_class=as_copy(bind.deployment.func_or_class, takes)),
                    bind.args,
                    bind.kwargs,
                )
            else:
                bind = bind_router(node, edges, context)
        except BuildError as e:
            problems.extend(e.problems)
            continue
        bound[node.id] = bind.deployment.bind()
        pending.append((bound[node.id], bind))
    if problems:
        raise BuildError(problems)
    for shell, bind in reversed(pending):
        rebind(shell, bind.deployment.bind(*bind.args, **bind.kwargs))
    roots = side.roots
    if len(roots) == 1:
        root: Application = bound[roots[0]]
        return root
    holder = serve.deployment(name=HOLDER, ray_actor_options={"num_cpus": 0})(Holder)
    return holder.bind(*(bound[r] for r in roots))


def as_copy(target: Any, takes_headers: bool) -> Any:
    """`target` (a user class or function) with `servegraph_call` and `servegraph_stream`:
    (payload, headers, user headers) → its `__call__` as a router would call it, of the same
    kind (async, generator, ...), so Serve runs it as it runs `__call__`."""
    cls = as_class(target) if inspect.isfunction(target) else target
    if not inspect.isclass(cls):
        return target
    method = cls.__call__

    def invoke(self: Any, payload: Any, user_headers: Any) -> Any:
        return self(payload, headers=user_headers) if takes_headers else self(payload)

    call: Any
    stream: Any
    if inspect.isasyncgenfunction(method):

        async def agen(self: Any, payload: Any, headers: Any, user_headers: Any) -> AsyncGenerator[Any, None]:
            async for item in invoke(self, payload, user_headers):
                yield item

        call, stream = _collected(agen), agen
    elif inspect.isgeneratorfunction(method):

        def gen(self: Any, payload: Any, headers: Any, user_headers: Any) -> Generator[Any, None, None]:
            yield from invoke(self, payload, user_headers)

        call, stream = (lambda self, *a: list(gen(self, *a))), gen
    elif inspect.iscoroutinefunction(method):

        async def coro(self: Any, payload: Any, headers: Any, user_headers: Any) -> Any:
            return await invoke(self, payload, user_headers)

        async def one(self: Any, payload: Any, headers: Any, user_headers: Any) -> AsyncGenerator[Any, None]:
            yield await invoke(self, payload, user_headers)

        call, stream = coro, one
    else:

        def plain(self: Any, payload: Any, headers: Any, user_headers: Any) -> Any:
            return invoke(self, payload, user_headers)

        def single(self: Any, payload: Any, headers: Any, user_headers: Any) -> Generator[Any, None, None]:
            yield invoke(self, payload, user_headers)

        call, stream = plain, single
    # Not named after a module attribute, so Ray pickles the subclass by value with its base.
    return type(cls.__name__, (cls,), {"servegraph_call": call, "servegraph_stream": stream, "__doc__": cls.__doc__})


def _collected(agen: Any) -> Any:
    async def call(self: Any, *args: Any) -> list[Any]:
        return [item async for item in agen(self, *args)]

    return call
