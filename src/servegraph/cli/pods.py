"""`--pods FILE`: the ServeGraph(s) whose pods a graph must fit, read as kubectl would.

A file may hold several YAML documents and `kind: List`s (the samples put a Secret
beside their ServeGraph); the ServeGraphs in it are picked, anything else is skipped,
and a file with none is refused, naming what it does hold. Each ServeGraph is checked
against the CRD's schema first (unknown fields are errors, as with `kubectl apply`), so
a misspelt `wrokers:` cannot silently leave the default pods in place. A document
without `kind` is read as a `spec.rayService` section alone.

What a ServeGraph renders is worked out by the operator's own reading of its spec
(`operator.spec`), so `validate --pods` sizes and renders exactly what it would.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from servegraph.cli import schema
from servegraph.cli.common import Failure, name_of, plural, read_input
from servegraph.names import API_VERSION, KIND
from servegraph.render import RayServiceOptions

MAX_MANIFEST_BYTES = 4 * 1024 * 1024
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"
"""A uid as long as the API server's, for the owner reference: the rendered size is the operator's."""


@dataclass(frozen=True)
class Pods:
    """One ServeGraph (or rayService section) of the file, as render options."""

    label: str
    """`ServeGraph NAME` or `spec.rayService`: how messages name it."""
    options: RayServiceOptions


def read_pods(path: Path | str, graph_name: str) -> list[Pods]:
    """The ServeGraphs of the file as the operator would render them; Failure for anything
    that is not YAML, holds no ServeGraph, or breaks the CRD's schema."""
    where = name_of(path)
    data = read_input(path, limit=MAX_MANIFEST_BYTES)
    if len(data) > MAX_MANIFEST_BYTES:
        raise Failure(f"error: {where}: over {MAX_MANIFEST_BYTES:,} bytes: not a manifest")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise Failure(f"error: {where}: not a YAML manifest (not UTF-8 text)") from None
    try:
        docs = [d for d in _flatten(yaml.safe_load_all(text)) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "cannot be read"
        raise Failure(f"error: {where}: not YAML{at}: {problem}") from None
    picked, others = [], []
    for doc in docs:
        if isinstance(doc, Mapping) and doc.get("kind") == KIND:
            picked.append(_servegraph(doc, where, graph_name))
        elif isinstance(doc, Mapping) and "kind" not in doc and "apiVersion" not in doc:
            picked.append(_section(doc, where, graph_name))
        else:
            others.append(_describe(doc))
    if not picked:
        found = f"it holds {', '.join(others)}" if others else "it is empty"
        raise Failure(f"error: {where}: no ServeGraph (nor a spec.rayService section) in it: {found}")
    return picked


def _flatten(docs: Any) -> Iterator[Any]:
    """Every object of every document, the items of a `kind: List` (or `ServeGraphList`) in turn."""
    for doc in docs:
        if isinstance(doc, Mapping) and str(doc.get("kind", "")).endswith("List") and "items" in doc:
            yield from _flatten(doc.get("items") or [])
        else:
            yield doc


def _describe(doc: Any) -> str:
    if not isinstance(doc, Mapping):
        return "a YAML " + ("list" if isinstance(doc, list) else type(doc).__name__)
    name = (doc.get("metadata") or {}).get("name") if isinstance(doc.get("metadata"), Mapping) else None
    return f"{doc.get('kind', 'an object without kind')}" + (f" {name}" if name else "")


def _servegraph(doc: Mapping[str, Any], where: str, graph_name: str) -> Pods:
    meta: Mapping[str, Any] = doc["metadata"] if isinstance(doc.get("metadata"), Mapping) else {}
    name = str(meta.get("name") or graph_name)
    label = f"ServeGraph {name}"
    if doc.get("apiVersion") != API_VERSION:
        raise Failure(
            f"error: {where}: {label}: apiVersion {doc.get('apiVersion')!r}; this servegraph reads {API_VERSION}"
        )
    body = {k: v for k, v in doc.items() if k != "metadata"}
    _refuse(schema.check(body, schema.servegraph_schema(), ""), where, label)
    namespace = str(meta.get("namespace") or "default")
    return Pods(label, _options(doc["spec"], name, namespace, where, label))


def _section(doc: Mapping[str, Any], where: str, graph_name: str) -> Pods:
    label = "spec.rayService"
    _refuse(schema.check(dict(doc), schema.rayservice_schema(), "spec.rayService"), where, label)
    spec = {"source": {"url": "https://registry.invalid/", "tokenSecretRef": {"name": "token"}}, "rayService": doc}
    return Pods(label, _options(spec, graph_name, "default", where, label))


def _refuse(problems: list[str], where: str, label: str) -> None:
    if problems:
        lines = [f"error: {where}: {label}, {p}" for p in problems]
        if len(problems) >= schema.MAX_REPORTED:
            lines.append(f"error: {where}: {label}: {plural(len(problems), 'problem')} shown, there may be more")
        raise Failure("\n".join(lines))


def _options(spec: Mapping[str, Any], name: str, namespace: str, where: str, label: str) -> RayServiceOptions:
    """The render options the operator takes from this spec (`operator.spec`)."""
    from servegraph.operator.spec import SpecError, owner_reference, parse_spec

    owner = owner_reference({"metadata": {"name": name, "uid": PLACEHOLDER_UID}})
    try:
        # The operator's default Service types (ClusterIP): its --allow-serve-service-types widens them.
        parsed = parse_spec(spec, namespace)
        return parsed.rayservice_options(name, namespace, owner)
    except (SpecError, ValueError) as exc:
        raise Failure(f"error: {where}: {label}: {exc}") from None
