"""Errors that name where a graph is wrong, all of them at once."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Problem:
    """One thing wrong with a graph, located by a human-readable path.

    The path reads like `application "fraud", node "scorer", field resources.num_gpus`
    so a registry author can find the spot without knowing servegraph's internals.
    """

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class GraphError(ValueError):
    """A graph could not be decoded or is invalid; carries every problem found."""

    def __init__(self, problems: list[Problem] | tuple[Problem, ...]) -> None:
        self.problems: tuple[Problem, ...] = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


def where(app: str | None = None, node: str | None = None, field: str | None = None) -> str:
    """Build the location prefix used in every problem message."""
    parts = []
    if app is not None:
        parts.append(f'application "{app}"')
    if node is not None:
        parts.append(f'node "{node}"')
    if field is not None:
        parts.append(f"field {field}")
    return ", ".join(parts)
