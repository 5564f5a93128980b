"""The runtime and the examples load in a Ray image that has nothing of servegraph's dependencies."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROBE = textwrap.dedent(
    """
    import sys

    import ray.serve  # whatever Ray itself loads is in every Ray image
    import starlette.requests

    before = set(sys.modules)
    import servegraph.examples
    from servegraph.runtime import build
    from servegraph.runtime.serve_internals import bound
    import servegraph.runtime.side  # a canary's side applications (built only inside Serve)
    import servegraph.runtime.stats

    app = build({"graph": {"name": "g", "version": "1"}, "ingress": "r", "nodes": [
        {"id": "t", "deployment": {"import_path": "servegraph.examples:Tokenizer"}},
        {"id": "s", "deployment": {"import_path": "servegraph.examples:Sentiment",
                                  "kwargs": {"tokenizer": {"node": "t"}}}},
        {"id": "e", "deployment": {"import_path": "servegraph.examples:Echo"}},
        {"id": "r", "sequence": {"steps": [{"node": "s", "timeout_s": 1, "retries": 1}, "e"]}},
    ], "telemetry": {"forward_headers": ["x-request-id"]}})
    ours = ("servegraph", "servegraph.runtime", "servegraph.dag", "servegraph.examples")
    extra = sorted(
        m for m in set(sys.modules) - before
        if m.split(".")[0] not in sys.stdlib_module_names
        and not any(m == p or m.startswith(p + ".") for p in ours[1:])
        and m != "servegraph"
    )
    print(bound(app).name, extra)
    """
)


def test_runtime_needs_nothing_but_ray() -> None:
    """No kopf, Kubernetes client, renderer or generated protobuf code: only Ray and the standard library,
    routers with call options and telemetry, a canary's side builder and stats included (OpenTelemetry is imported by a router's replica,
    when it starts, never by the builder).

    `servegraph.dag` (the model and the args codec) is allowed because it is standard library only:
    any third-party module it pulled in would show up in `extra`.
    """
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "r []"


def test_the_package_root_imports_nothing() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; before = set(sys.modules); import servegraph; "
            "print(sorted(m for m in set(sys.modules) - before if not m.startswith('servegraph')))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_command_line_and_the_grpc_wire_import_no_ray() -> None:
    """The operator's image has no Ray: `servegraph run` must start without it, though the
    command line shares GraphService's wire rules with the runtime (a crash loop once)."""
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; import servegraph.cli.main, servegraph.grpc_client, servegraph.runtime.grpcwire; "
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
