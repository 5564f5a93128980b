"""An application's own gRPC servicer functions (`grpc_servicer_functions`).

Ray Serve's gRPC proxy imports each listed `add_<Name>Servicer_to_server` on every
node and registers it for the whole cluster, so one bad entry costs every
application its gRPC: the form is checked here, before anything is rendered.
Whether the module exists is known only inside the Ray image.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from servegraph.graph.errors import Problem, where

GRAPH_SERVICE_SERVICER = "servegraph.v1.service_pb2_grpc.add_GraphServiceServicer_to_server"
"""GraphService's servicer function: every application has it, the renderer lists it first."""
MAX_SERVICERS = 32
MAX_LENGTH = 256
"""Characters in one import path; Python module paths are far shorter."""

_DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")


def servicer_functions(app: str, entries: Sequence[str], add: Callable[[Problem], None]) -> tuple[str, ...]:
    """The valid entries in their order; each problem names the application and the entry."""
    if len(entries) > MAX_SERVICERS:
        field = where(app=app, field="grpc_servicer_functions")
        add(Problem(field, f"{len(entries)} entries, over the limit of {MAX_SERVICERS}"))
        return ()
    seen: list[str] = []
    for i, entry in enumerate(entries):
        field = where(app=app, field=f"grpc_servicer_functions[{i}]")
        if len(entry) > MAX_LENGTH:
            add(Problem(field, f"an import path over the limit of {MAX_LENGTH} characters"))
        elif ":" in entry:
            add(Problem(field, f"{entry!r}: write it dotted (module.function), as Ray Serve's gRPC options do"))
        elif not _DOTTED.fullmatch(entry):
            add(
                Problem(
                    field,
                    f"{entry!r} is not a Python import path of a function "
                    "(module.function, e.g. my_pkg.my_pb2_grpc.add_MyServicer_to_server)",
                )
            )
        elif entry == GRAPH_SERVICE_SERVICER:
            add(Problem(field, f"{entry!r} is always served (servegraph's GraphService); remove it"))
        elif entry in seen:
            add(Problem(field, f"{entry!r} is listed twice"))
        else:
            seen.append(entry)
    return tuple(seen)
