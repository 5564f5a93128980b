"""User code for the e2e graphs: what a graph author would ship in their image.

Ray workers import it by name (`e2e_apps:...`) because the test head runs with
this directory on PYTHONPATH. Each class is deliberately trivial so a test's
expected output is obvious from the graph.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ray import serve


class Stamp:
    """Appends its tag to the payload's `trail`: a chain's order shows in the output."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __call__(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        return {**payload, "trail": [*payload.get("trail", []), self.tag]}


class Scale:
    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, payload: Mapping[str, Any]) -> float:
        return float(payload["x"]) * self.factor


@serve.deployment
class Total:
    """Already a Serve Deployment, so the builder renames it with `.options(name=...)`."""

    def __call__(self, parts: Mapping[str, float]) -> dict[str, Any]:
        return {"total": sum(parts.values()), "parts": dict(parts)}


class Tag:
    """Says which branch took the request."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, payload: Any) -> dict[str, Any]:
        return {"tag": self.name, "payload": payload}


def echo(payload: Any) -> dict[str, Any]:
    """A function deployment."""
    return {"echo": payload}


class Configurable:
    """Reports its user_config, how often reconfigure ran, and which replica answers."""

    def __init__(self) -> None:
        self.threshold: Any = None
        self.reconfigures = 0

    def reconfigure(self, user_config: Mapping[str, Any]) -> None:
        self.threshold = user_config.get("threshold")
        self.reconfigures += 1

    def __call__(self, request: Any) -> dict[str, Any]:
        context = serve.get_replica_context()
        return {
            "threshold": self.threshold,
            "reconfigures": self.reconfigures,
            "replica_id": context.replica_id.unique_id,
            "pid": os.getpid(),
        }
