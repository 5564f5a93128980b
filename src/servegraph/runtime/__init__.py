"""servegraph's Ray Serve runtime: rebuilds a rendered DAG inside a Ray cluster.

Runs where only `ray[serve]` is installed, so it imports nothing else of
servegraph's dependencies (`servegraph.dag` is standard library only). A Serve
application rendered by servegraph has `import_path: servegraph.runtime:build`
and the DAG in `args`, in the format of `servegraph.dag.args` (see `build`).

How a request flows
-------------------
* The ingress node receives the HTTP request.
  - A user deployment at the ingress gets the starlette `Request` itself, and
    Serve turns its return value into the response, as in any Serve app.
  - A router at the ingress turns the request into a *payload* — the body
    parsed as JSON if it is valid JSON, else the body as UTF-8 text, or None
    when the body is empty (the query string and method are not part of it),
    within its limits (`payload.Limits`: bytes, values, depth; 413 or 400 over
    them) — and keeps the headers (names lower-cased) for `switch` nodes. Its result
    is the response: JSON, status 200; a result that is not JSON-serializable
    gives status 500 with `{"error": ...}`.
* Routers call user deployments with the payload only:
  `await handle.remote(payload)`, i.e. the deployment's `__call__(payload)`,
  plus `headers=` (trace context and forwarded headers) when `__call__`
  declares that keyword. Routers call routers with `route(payload, headers)`,
  so headers reach a `switch` at any depth.
* Each call is an edge: timeout per attempt and retries as the graph says,
  metrics labelled with the graph's name and version, a span when
  OpenTelemetry records (`calls.py`, `telemetry.py`).
* `sequence`: each step's output is the next step's input; the last output
  is the result.
* `ensemble`: members get the same payload concurrently; the result is
  `{member id: output}`, or, with a combiner, the combiner's output given
  that dict as its payload.
* `switch`: compares a top-level field of a JSON-object payload (strings as
  they are, other scalars as their JSON text: `true`, `3`, `null`) or a header
  value with each case's `equals`; the first equal case wins, otherwise (field
  or header missing, payload not an object, no match) the default.
* `splitter`: picks one route per request in proportion to the given weights
  (spread evenly, not at random: `choice.Spread`).
* A user deployment calling a router through a handle it was bound to gets the
  router's result as a Python value: `await router.remote(payload)`.
* An exception in any node propagates to the ingress; Serve answers 500. A
  node that timed out (and was not an optional ensemble member) gives a 504
  naming it. A caller is told which node failed and the error's type, never
  its message: that goes to the replica's log (`calls.describe`, `calls.logged`).
* During a canary the ingress router picks the version per request (pin header,
  sticky key, weight; `ingress.py`) and every router calls a copy of the new version
  in its side application instead of its own child where the route says
  (`routing.py`); a side application is built by `side.py` (docs/runtime.md#canaries).
"""

from typing import Any

from servegraph.dag.args import BuildError

__all__ = ["BuildError", "build"]


def __getattr__(name: str) -> Any:
    # `build` imports Ray; loaded when Serve resolves `servegraph.runtime:build`, so the
    # modules here that need no Ray (the payload and gRPC wire rules, which the operator's
    # command line shares) import without it.
    if name == "build":
        from servegraph.runtime.builder import build

        return build
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
