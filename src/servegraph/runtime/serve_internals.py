"""Ray Serve's internals, touched here and nowhere else.

The builder binds every node twice (`builder.build`): first bare, so each parent can be bound
with its children's Applications, then for real, parents first. The second binding must
land in the Application object the parents already hold, and Serve has no public way to
refill one: an Application keeps what it binds in `_bound_deployment`, the deployment with
its `init_args` and `init_kwargs`, which Serve reads when it builds the application. That is
proven on Ray Serve `PROVEN` (the version the wheel's `ray` extra pins and the test bed's
images run); the runtime cannot pin Ray (it runs in the user's image), so a Ray without the
attribute fails the build with a message naming its version, and `check` (run by
tests/unit/test_serve_internals.py on the Ray installed) fails when the attribute is there
but Serve no longer builds from it.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.serve import Application, Deployment

from servegraph.dag.args import BuildError

PROVEN = "2.60"
"""The Ray release this module's use of Serve's internals was read from and tested on."""


class ServeChanged(RuntimeError):
    """The installed Ray Serve no longer builds an application the way `rebind` relies on."""


def _moved(what: str) -> str:
    return f"Ray {ray.__version__} {what}; servegraph's builder relies on it as in Ray {PROVEN} (runtime/serve_internals.py)"


def bound(app: Application) -> Deployment:
    """The deployment an Application binds, with its arguments: what Serve builds from."""
    deployment = getattr(app, "_bound_deployment", None)
    if not isinstance(deployment, Deployment):
        raise BuildError([_moved("keeps no deployment in Application._bound_deployment")])
    return deployment


def rebind(shell: Application, filled: Application) -> None:
    """Make `shell` (bound bare, already held by its parents) bind what `filled` binds."""
    bound(shell)
    shell._bound_deployment = bound(filled)


def check() -> None:
    """ServeChanged, naming the installed Ray, when Serve no longer builds an application from
    what `rebind` put in it: a shell refilled with arguments, one of them another application."""
    from ray import serve
    from ray.serve._private.build_app import build_app
    from ray.serve.handle import DeploymentHandle

    class Parent:
        def __init__(self, *args: Any, **kwargs: Any) -> None: ...

    class Child: ...

    parent_deployment, child_deployment = serve.deployment(name="parent")(Parent), serve.deployment(name="child")(Child)
    shell = parent_deployment.bind()
    rebind(shell, parent_deployment.bind(1, child=child_deployment.bind()))
    built = {d.name: d for d in build_app(shell, name="probe").deployments}
    parent = built.get("parent")
    if parent is None or set(built) != {"parent", "child"}:
        raise ServeChanged(_moved(f"builds the deployments {sorted(built)} from a refilled Application"))
    handle = getattr(parent, "init_kwargs", {}).get("child")  # typed a tuple by Ray, a dict in fact
    if parent.init_args != (1,) or not isinstance(handle, DeploymentHandle) or handle.deployment_name != "child":
        got = f"{parent.init_args!r} {parent.init_kwargs!r}"
        raise ServeChanged(_moved(f"builds the arguments {got} from a refilled Application, not (1,) and a handle"))
