"""The application builder: Serve config `args` → the ingress Application.

A Serve config can only override options of deployments its application
builds; it cannot say who binds whom. So the DAG travels in `args` and is
bound here, inside the cluster, in the order the renderer lists the nodes.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, assert_never

from ray import serve
from ray.serve import Application, Deployment

from servegraph.dag import streams
from servegraph.dag.args import BuildError, decode, refs
from servegraph.dag.model import (
    Argument,
    Call,
    Constant,
    DeploymentKind,
    EnsembleKind,
    Node,
    NodeKind,
    SequenceKind,
    SplitterKind,
    SwitchKind,
)
from servegraph.runtime.calls import Child
from servegraph.runtime.choice import Choice, SplitChoice, SwitchChoice
from servegraph.runtime.grpc_ingress import with_graph_service
from servegraph.runtime.routers import (
    EnsembleRouter,
    SequenceRouter,
    SplitterRouter,
    SwitchRouter,
)
from servegraph.runtime.serve_internals import rebind
from servegraph.runtime.telemetry import GraphContext


def build(args: Mapping[str, Any]) -> Application:
    """Bind every node and return the ingress Application.

    Serve calls this with the application's `args` (`import_path:
    servegraph.runtime:build`). Raises BuildError listing every problem; Serve
    shows it as the application's DEPLOY_FAILED message.

    Two passes, because Serve pickles a deployment's arguments when it is bound, and
    a bound child carries its own arguments both pickled and live: binding bottom-up
    doubles what each level holds (a chain of 14 plain Serve deployments takes 1.9 GiB,
    16 chained switches 14 GiB). So every node is first bound without arguments, then,
    parents before children, given its real ones: each pickle holds one level.
    """
    if isinstance(args, Mapping) and "side" in args:  # a canary's copies (side.py)
        from servegraph.runtime.side import build_side

        return build_side(args)
    dag = decode(args)
    context = GraphContext(dag.graph_name or "", dag.graph_version or "", dag.telemetry)
    routers = {n.id for n in dag.nodes if not isinstance(n.kind, DeploymentKind)}
    kinds = {n.id: n.kind for n in dag.nodes}
    order = [n.id for n in dag.nodes]
    problems: list[str] = [
        f'node "{node}"' + (f", field {field}" if field else "") + f": {message}"
        for node, field, message in streams.problems(kinds, order, dag.ingress)
    ]
    if problems:
        raise BuildError(problems)
    streaming = streams.streaming_outputs(kinds, order)
    bound: dict[str, Application] = {}
    pending: list[tuple[Application, Bind]] = []
    takes_headers: set[str] = set()
    edges = Edges(bound, kinds, routers, takes_headers, streaming)
    for node in dag.nodes:
        if any(ref not in bound for _, ref in refs(node.kind)):
            continue  # a dependency already failed and was reported
        try:
            if isinstance(node.kind, DeploymentKind):
                bind, asks = bind_deployment(node.id, node.kind, bound, node.id == dag.ingress)
                if asks:
                    takes_headers.add(node.id)
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
    return bound[dag.ingress]


@dataclass(frozen=True)
class Bind:
    """A node's deployment and the arguments it is bound with once its parents are."""

    deployment: Deployment
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Edges:
    """What a router needs to know of the nodes below it to call them."""

    bound: Mapping[str, Application]
    kinds: Mapping[str, NodeKind]
    routers: set[str]
    takes_headers: set[str]
    streaming: frozenset[str]
    choices: dict[tuple[str, int], Choice | None] = field(default_factory=dict)

    def child(self, ref: str, call: Call, depth: int = 0) -> Child:
        """The child `ref` over an edge with `call`'s options; a switch or splitter with its
        choice, so the router above it decides and calls the grandchild itself (`choice.py`)."""
        return Child(
            ref,
            self.bound[ref],
            ref in self.routers,
            call,
            ref in self.takes_headers,
            ref in self.streaming,
            self.choice(ref, depth),
        )

    def choice(self, ref: str, depth: int) -> Choice | None:
        """One choice object per node and depth, shared by every edge into it, so switches
        whose cases meet again stay as large as the graph (built per edge, they doubled
        per link). Past `MAX_CHOICE_DEPTH` chained choices the switch's replica decides:
        every router above carries the chain in its arguments."""
        key = (ref, depth)
        if key in self.choices:
            return self.choices[key]
        kind = self.kinds[ref]
        choice: Choice | None = None
        if depth < MAX_CHOICE_DEPTH:
            match kind:
                case SwitchKind():
                    cases = [(eq, self.child(r, kind.call(i), depth + 1)) for i, (eq, r) in enumerate(kind.cases)]
                    default = self.child(kind.default, kind.call(len(cases)), depth + 1)
                    choice = SwitchChoice.of(cases, default, kind.field, kind.header)
                case SplitterKind():
                    routes = tuple(self.child(r, kind.call(i), depth + 1) for i, (r, _) in enumerate(kind.routes))
                    choice = SplitChoice(routes, tuple(w for _, w in kind.routes))
                case DeploymentKind() | SequenceKind() | EnsembleKind():
                    pass  # called through its own replica: nothing for the router above to decide
                case _:
                    assert_never(kind)
        self.choices[key] = choice
        return choice


# How many switches and splitters in a row one router decides; a longer chain is rare, and
# each link would be carried in the arguments of every router above it.
MAX_CHOICE_DEPTH = 8


def bind_router(node: Node, edges: Edges, context: GraphContext) -> Bind:
    kind = node.kind
    assert not isinstance(kind, DeploymentKind)
    # Only a streaming router is told so: every other router is bound exactly as before streams existed.
    streams = {"streams": True} if node.id in edges.streaming else {}

    def child(index: int, ref: str) -> Child:
        return edges.child(ref, kind.call(index))

    match kind:
        case SequenceKind():
            steps = [child(i, s) for i, s in enumerate(kind.steps)]
            return Bind(_router(SequenceRouter, node.id), (node.id, steps), {"context": context, **streams})
        case EnsembleKind():
            members = [child(i, m) for i, m in enumerate(kind.members)]
            combiner = child(len(members), kind.combiner) if kind.combiner is not None else None
            return Bind(_router(EnsembleRouter, node.id), (node.id, members, combiner), {"context": context, **streams})
        case SwitchKind():
            cases = [(equals, child(i, ref)) for i, (equals, ref) in enumerate(kind.cases)]
            default = child(len(cases), kind.default)
            options = {"field": kind.field, "header": kind.header, "context": context, **streams}
            return Bind(_router(SwitchRouter, node.id), (node.id, cases, default), options)
        case SplitterKind():
            routes = [(child(i, r), w) for i, (r, w) in enumerate(kind.routes)]
            return Bind(_router(SplitterRouter, node.id), (node.id, routes), {"context": context, **streams})
        case _:
            assert_never(kind)


def _router(cls: type, node_id: str) -> Deployment:
    return serve.deployment(name=node_id)(cls)


def bind_deployment(
    node_id: str, kind: DeploymentKind, bound: Mapping[str, Application], ingress: bool
) -> tuple[Bind, bool]:
    """The deployment with its arguments, and whether its `__call__` asks for the forwarded headers.

    User code at the ingress also answers GraphService (`grpc_ingress.py`)."""
    where = f'node "{node_id}", field deployment.import_path: {kind.import_path!r}'
    deployment = as_deployment(node_id, resolve_import_path(kind.import_path, where), where)
    args = [_value(a, bound) for a in kind.args]
    kwargs = {k: _value(a, bound) for k, a in kind.kwargs}
    target = deployment.func_or_class
    check_arguments(target, args, kwargs, f'node "{node_id}"')
    asks = takes_headers(target)
    if ingress:
        served = with_graph_service(target, node_id, asks)
        if served is not target:
            deployment = deployment.options(func_or_class=served)
    return Bind(deployment, tuple(args), kwargs), asks


def takes_headers(target: Any) -> bool:
    """Whether user code declares a `headers` keyword on what a router calls (its `__call__`,
    or the function itself): only then does it receive the forwarded headers, so code
    written for plain Serve handles keeps working unchanged."""
    method = target if inspect.isfunction(target) else getattr(target, "__call__", None)  # noqa: B004
    if method is None or (inspect.isclass(target) and method is type.__call__):
        return False
    try:
        parameter = inspect.signature(method).parameters.get("headers")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )


def _value(arg: Argument, bound: Mapping[str, Application]) -> Any:
    # A bound Application becomes the DeploymentHandle of that node when Serve builds the app.
    return arg.value if isinstance(arg, Constant) else bound[arg.node]


def resolve_import_path(import_path: str, where: str) -> Any:
    """Import `module:attr` (or `module.attr`, as Serve accepts); BuildError saying what is missing."""
    module_name, sep, attr = import_path.partition(":")
    if not sep:
        module_name, _, attr = import_path.rpartition(".")
    if not module_name or not attr:
        raise BuildError([f"{where}: must look like 'module.path:Attribute'"])
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise BuildError(
                [
                    f"{where}: module {module_name!r} not found "
                    "(is it installed in the Ray image or listed in runtime_env?)"
                ]
            ) from e
        raise BuildError([f"{where}: importing {module_name!r} failed: {type(e).__name__}: {e}"]) from e
    except Exception as e:
        raise BuildError([f"{where}: importing {module_name!r} failed: {type(e).__name__}: {e}"]) from e
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise BuildError([f"{where}: module {module_name!r} has no attribute {attr!r}"]) from None
    return obj


def as_deployment(node_id: str, obj: Any, where: str) -> Deployment:
    """A Serve Deployment named after the node, from a Deployment, a class or a function."""
    if isinstance(obj, Deployment):
        return obj.options(name=node_id)
    if isinstance(obj, Application):
        raise BuildError(
            [f"{where}: is a bound Application (the result of .bind()); point it at the deployment, class or function"]
        )
    if inspect.isclass(obj) or inspect.isfunction(obj):
        return serve.deployment(name=node_id)(obj)
    raise BuildError([f"{where}: is a {type(obj).__name__}, not a Ray Serve deployment, a class or a function"])


def check_arguments(target: Any, args: list[Any], kwargs: dict[str, Any], where: str) -> None:
    """Fail at build time, naming the node, rather than in a replica's constructor.

    A function deployment is called per request and Serve drops constructor
    arguments silently, so arguments bound to one are an error too.
    """
    if inspect.isfunction(target):
        if args or kwargs:
            raise BuildError(
                [f"{where}: {target.__qualname__} is a function and takes no constructor arguments; use a class"]
            )
        return
    if not inspect.isclass(target):
        return
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # no introspectable signature: let the replica decide
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as e:
        raise BuildError([f"{where}: arguments do not match {target.__qualname__}{signature}: {e}"]) from None
