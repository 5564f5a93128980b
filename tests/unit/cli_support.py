"""The CLI as a user runs it (a real process, a bare environment), and a stand-in API server.

The stand-in answers only what `rollback`, `restart`, `status` and `diff sg/NAME` ask (a
ServeGraph and its RayService by path), records every request, and is plain HTTP on
loopback: these tests are about what the command line does with the answers (the
namespace it asks in, what it sends, what it prints); the same commands run against the
real API server in tests/integration/test_suspend_restart.py and the node tier.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml


def run_cli(*args: str, home: Path, env: Mapping[str, str] | None = None, stdin: str | None = None) -> Any:
    """`python -m servegraph.cli ARGS` with no kubeconfig anywhere and not in a pod, unless `env` says."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "SERVEGRAPH_DEBUG"))}
    clean.update({"HOME": str(home), **(env or {})})
    return subprocess.run(
        [sys.executable, "-m", "servegraph.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean,
        input=stdin,
    )


@dataclass
class StandIn:
    """Objects by API path; every request as (method, path with query, JSON body)."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    port: int = 0

    def kubeconfig(self, path: Path, namespace: str | None = None, context: str = "dev") -> Path:
        ctx: dict[str, Any] = {"cluster": "c", "user": "u"}
        if namespace:
            ctx["namespace"] = namespace
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [
                {"name": context, "context": ctx},
                {"name": "other", "context": {"cluster": "c", "user": "u"}},
            ],
            "current-context": context,
        }
        path.write_text(yaml.safe_dump(doc))
        return path


@contextmanager
def stand_in_api(objects: dict[str, dict[str, Any]] | None = None) -> Iterator[StandIn]:
    state = StandIn(objects=dict(objects or {}))

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            return

        def _answer(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            state.requests.append(("GET", self.path, None))
            found = state.objects.get(urlsplit(self.path).path)
            if found is None:
                self._answer(404, {"kind": "Status", "reason": "NotFound", "code": 404})
            else:
                self._answer(200, found)

        def do_PATCH(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null")
            state.requests.append(("PATCH", self.path, body))
            self._answer(200, state.objects.get(urlsplit(self.path).path) or {})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def servegraph_path(namespace: str, name: str) -> str:
    return f"/apis/servegraph.io/v1alpha1/namespaces/{namespace}/servegraphs/{name}"


def one_line(out: Any) -> str:
    """The stderr of a failed command, which must be exactly one line and no traceback."""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    return str(lines[0])
