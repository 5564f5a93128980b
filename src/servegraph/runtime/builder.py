"""The application builder: Serve config `args` → the ingress Application.

A Serve config can only override options of deployments its application
builds; it cannot say who binds whom. So the DAG travels in `args` and is
bound here, inside the cluster, in the order the renderer lists the nodes.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from ray import serve
from ray.serve import Application, Deployment

from servegraph.runtime.routers import (
    Child,
    EnsembleRouter,
    SequenceRouter,
    SplitterRouter,
    SwitchRouter,
)
from servegraph.runtime.spec import (
    BuildError,
    DeploymentNode,
    EnsembleNode,
    Literal,
    Node,
    SequenceNode,
    SplitterNode,
    SwitchNode,
    parse_args,
)


def build(args: Mapping[str, Any]) -> Application:
    """Bind every node in topological order and return the ingress Application.

    Serve calls this with the application's `args` (`import_path:
    servegraph.runtime:build`). Raises BuildError listing every problem; Serve
    shows it as the application's DEPLOY_FAILED message.
    """
    spec = parse_args(args)
    routers = {n.id for n in spec.nodes if not isinstance(n, DeploymentNode)}
    bound: dict[str, Application] = {}
    problems: list[str] = []
    for node in spec.nodes:
        if any(ref not in bound for _, ref in node.refs()):
            continue  # a dependency already failed and was reported
        try:
            bound[node.id] = _bind(node, bound, routers)
        except BuildError as e:
            problems.extend(e.problems)
    if problems:
        raise BuildError(problems)
    return bound[spec.ingress]


def _bind(node: Node, bound: Mapping[str, Application], routers: set[str]) -> Application:
    def child(ref: str) -> Child:
        return Child(id=ref, handle=bound[ref], router=ref in routers)

    match node:
        case DeploymentNode():
            return _bind_deployment(node, bound)
        case SequenceNode():
            return _router(SequenceRouter, node.id).bind(node.id, [child(s) for s in node.steps])
        case EnsembleNode():
            combiner = child(node.combiner) if node.combiner is not None else None
            return _router(EnsembleRouter, node.id).bind(node.id, [child(m) for m in node.members], combiner)
        case SwitchNode():
            cases = [(equals, child(ref)) for equals, ref in node.cases]
            return _router(SwitchRouter, node.id).bind(
                node.id, cases, child(node.default), field=node.field, header=node.header
            )
        case SplitterNode():
            return _router(SplitterRouter, node.id).bind(node.id, [(child(r), w) for r, w in node.routes])


def _router(cls: type, node_id: str) -> Deployment:
    return serve.deployment(name=node_id)(cls)


def _bind_deployment(node: DeploymentNode, bound: Mapping[str, Application]) -> Application:
    where = f'node "{node.id}", field deployment.import_path: {node.import_path!r}'
    deployment = as_deployment(node.id, resolve_import_path(node.import_path, where), where)
    args = [_value(a, bound) for a in node.args]
    kwargs = {k: _value(a, bound) for k, a in node.kwargs}
    check_arguments(deployment.func_or_class, args, kwargs, f'node "{node.id}"')
    return deployment.bind(*args, **kwargs)


def _value(arg: Any, bound: Mapping[str, Application]) -> Any:
    # A bound Application becomes the DeploymentHandle of that node when Serve builds the app.
    return arg.value if isinstance(arg, Literal) else bound[arg.node]


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
