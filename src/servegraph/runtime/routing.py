"""A base router's routes during a canary: which version a request is on, and where its child is.

The routes arrive in the router's `user_config` (`dag/routeargs.py`, written by
`render/canary.py`): for each route (`live`, `canary`) the version it serves, the side
application holding that version's copies, and the copies this router must call there
instead of its own child. The ingress router chose the route and said it in
`ROUTE_HEADER`; a router reads it at every call it makes, at any depth of its choice tree
(a switch's grandchild that is a copy is redirected just like a child). A redirected call
goes to `servegraph_call` (or `servegraph_stream`) of the copy, which a side application's
builder gives every copy (`side.py`): the base router need not know how the new version's
code takes its arguments. Handles by name are made once per (application, node) and
dropped when no route names their application any more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from servegraph.dag.args import CANARY, LIVE, ROUTE_HEADER, Route, Settings
from servegraph.runtime.calls import Child, Opener
from servegraph.runtime.payload import Headers

REDIRECT_CALL = "servegraph_call"
"""The method a copy answers a base router's redirected call on: (payload, headers, user headers)."""
REDIRECT_STREAM = "servegraph_stream"

HandleFactory = Callable[[str, str], Any]
"""(node id, application) → a DeploymentHandle; Serve's `get_deployment_handle` in a replica."""


def serve_handle(node: str, app: str) -> Any:
    from ray import serve

    return serve.get_deployment_handle(node, app_name=app, _check_exists=False)


class Routing:
    """The routes a router was told and the handles of the copies it redirects to."""

    def __init__(self, version: str = "", handles: HandleFactory = serve_handle) -> None:
        self.settings = Settings()
        self.active = False
        """Whether any route is set: without one, a router does exactly what it did before canaries."""
        self.default_version = version
        self._make = handles
        self._handles: dict[tuple[str, str, bool], Opener] = {}
        """(node, side application, stream) → how to call that copy, made once."""

    def update(self, settings: Settings, version: str) -> None:
        """New routes (a `reconfigure`); handles of applications no route names are dropped."""
        self.settings = settings
        self.default_version = version
        self.active = settings.live is not None or settings.canary is not None
        apps = {r.app for r in (settings.live, settings.canary) if r is not None and r.app is not None}
        self._handles = {k: h for k, h in self._handles.items() if k[1] in apps}

    def route(self, headers: Headers) -> Route | None:
        """The route a request is on (the header the ingress set; absent: live)."""
        return self.settings.canary if headers.get(ROUTE_HEADER) == CANARY else self.settings.live

    def version(self, headers: Headers) -> str:
        """The version serving a request: its route's, else the base's."""
        route = self.route(headers) if self.active else None
        return route.version if route is not None else self.default_version

    def route_name(self, headers: Headers) -> str:
        return CANARY if headers.get(ROUTE_HEADER) == CANARY else LIVE

    def opener(self, child: Child, headers: Headers, stream: bool) -> Opener | None:
        """How to call `child` on this request's route: its copy's, or None (the router's own)."""
        if not self.active:
            return None
        route = self.route(headers)
        if route is None or route.app is None or child.id not in route.nodes:
            return None
        key = (child.id, route.app, stream)
        opener = self._handles.get(key)
        if opener is None:
            opener = self._handles[key] = _redirect(self._make(child.id, route.app), stream)
        return opener


def _redirect(base: Any, stream: bool) -> Opener:
    """An opener calling a copy's `servegraph_call` (or `servegraph_stream`) through `base`."""
    handle = (
        base.options(method_name=REDIRECT_STREAM, stream=True) if stream else base.options(method_name=REDIRECT_CALL)
    )

    def redirected(_: Child, payload: Any, sent: Headers, user_headers: Headers) -> Any:
        return handle.remote(payload, sent, user_headers)

    return redirected
