"""Docs that restate the code are checked against it, so they cannot go stale unnoticed."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf.message import Message
from support import ROOT, SAMPLES


def _rbac_table(markdown: str) -> dict[str, set[str]]:
    """resource → verbs from the `| resource | verbs | why |` table; a row with an
    empty first cell continues the resource above it."""
    table: dict[str, set[str]] = {}
    resource = ""
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[1].startswith("`"):
            continue
        if cells[0]:
            resource = re.findall(r"`([^`]+)`", cells[0])[0]
        table.setdefault(resource, set()).update(re.findall(r"`([^`]+)`", cells[1]))
    return table


def test_the_rbac_table_in_install_md_is_the_clusterrole() -> None:
    role = yaml.safe_load((ROOT / "config" / "rbac" / "role.yaml").read_text())
    granted: dict[str, set[str]] = {}
    for rule in role["rules"]:
        for resource in rule["resources"]:
            granted.setdefault(resource, set()).update(rule["verbs"])
    assert _rbac_table((ROOT / "docs" / "install.md").read_text()) == granted


def test_the_runtime_doc_names_the_error_type_the_builder_raises() -> None:
    from servegraph.runtime import BuildError

    qualified = f"{BuildError.__module__}.{BuildError.__qualname__}: "
    assert qualified in (ROOT / "docs" / "runtime.md").read_text()


# ---- every module has its place in docs/architecture.md ----------------------------

PACKAGE = ROOT / "src" / "servegraph"
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def _modules() -> set[str]:
    """Every source module, relative to src/servegraph (generated v1/ and __init__.py aside)."""
    return {
        p.relative_to(PACKAGE).as_posix()
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py" and p.relative_to(PACKAGE).parts[0] != "v1"
    }


def _named_modules(markdown: str) -> set[str]:
    """The modules the doc names: a full path (`operator/writer.py`) anywhere, or a bare
    `writer.py` in the block of its package (from a `**`operator/`**` heading to the next
    bold heading; a bare name outside a package block is a top-level module)."""
    named: set[str] = set()
    prefix = ""
    for line in markdown.splitlines():
        heading = re.match(r"\*\*`?([^`*]+)`?\*\*", line)
        if heading:
            prefix = heading[1] if heading[1].endswith("/") else ""
        for token in re.findall(r"`([^`\s]+\.py)\b", line):
            token = token.removeprefix("src/").removeprefix("servegraph/")
            named.add(token if "/" in token else prefix + token)
    return named


def test_the_architecture_names_every_module() -> None:
    missing = _modules() - _named_modules(ARCHITECTURE.read_text())
    assert not missing, f"docs/architecture.md does not say what these modules are for: {sorted(missing)}"


def test_the_module_check_can_fail() -> None:
    named = _named_modules("**`operator/`** — x\n- `writer.py`: y\n\n**`cli.py`** — z `names.py`\n")
    assert named == {"operator/writer.py", "cli.py", "names.py"}
    assert "render/writer.py" not in named, "a bare name counts only in its own package's block"


# ---- every repository path the docs name exists --------------------------------------

DOCS = [
    ROOT / "README.md",
    ROOT / "BENCHMARKS.md",
    ROOT / "BENCHMARKS-HISTORY.md",
    *sorted((ROOT / "docs").glob("*.md")),
]
FILE_EXTENSIONS = {
    "c",
    "Dockerfile",
    "env",
    "go",
    "json",
    "md",
    "pb",
    "proto",
    "py",
    "sh",
    "toml",
    "tpl",
    "txtpb",
    "yaml",
    "yml",
}
BASES = [
    ROOT / "src",
    ROOT / "src" / "servegraph",
    ROOT / "testbed" / "servegraph_testbed",
    ROOT / "charts" / "servegraph-operator",
]
"""Where a doc may name a path from besides the repository and the doc's folder: the package
(`servegraph/names.py`, `dag/args.py`), the testbed's package, the chart."""
ELSEWHERE = {
    "build/pause/linux/pause.c": "Kubernetes' own tree, not this one",
    "build/bench/": "written by `make bench` (git-ignored)",
}


def _looks_like_a_path(word: str) -> bool:
    if "/" not in word or word.startswith(("/", "~", "-")) or "://" in word:
        return False
    first = word.split("/", 1)[0]
    if "." in first.strip("."):  # a host or an API group: ghcr.io/…, servegraph.io/graph
        return False
    last = word.rstrip("/").rsplit("/", 1)[-1]
    return word.endswith("/") or ("." in last and last.rsplit(".", 1)[-1] in FILE_EXTENSIONS)


def _named_paths(markdown: str) -> tuple[set[str], set[str]]:
    """(paths in backticks, link targets): words of a code span that look like a
    repository path, minus any `:symbol` after them; relative link targets, minus anchors."""
    spans: set[str] = set()
    for span in re.findall(r"`([^`\n]+)`", markdown):
        for word in span.split():
            word = word.split(":", 1)[0]
            if _looks_like_a_path(word):
                spans.add(word)
    links = {
        target.split("#", 1)[0]
        for target in re.findall(r"\]\(([^)\s]+)\)", markdown)
        if "://" not in target and not target.startswith(("#", "mailto:"))
    }
    return spans, links


def _exists(path: str, doc_dir: Path) -> bool:
    pattern = path.replace("…", "**")
    return any(list(base.glob(pattern.rstrip("/"))) for base in [ROOT, doc_dir, *BASES])


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    spans, links = _named_paths(doc.read_text())
    missing = {p for p in spans if p not in ELSEWHERE and not _exists(p, doc.parent)}
    missing |= {p for p in links if not (doc.parent / p).exists()}
    assert not missing, f"{doc.relative_to(ROOT)} names paths that do not exist: {sorted(missing)}"


def test_the_path_check_can_fail() -> None:
    spans, links = _named_paths(
        "`operator/nothing.py` `kubectl apply -f config/samples/none.yaml` `render/serve_config.py:f` "
        "`ghcr.io/servegraph/` `servegraph.io/graph` `127.0.0.0/8` `spec.rayService.head/workers.resources` "
        "[x](docs/none.md#a) [y](https://example.com/a.md)"
    )
    assert spans == {"operator/nothing.py", "config/samples/none.yaml", "render/serve_config.py"}
    assert links == {"docs/none.md"}
    assert not _exists("operator/nothing.py", ROOT) and _exists("render/serve_config.py", ROOT)
    assert _exists("proto/…/graph.proto", ROOT) and _exists("examples/", ROOT)


# ---- every --build-arg a doc or sample gives is an ARG a Dockerfile reads ------------
# Docker ignores a build argument no ARG declares: a renamed ARG would leave the docs
# building the CPU image under a GPU tag, with no error anywhere.


def _build_args(text: str) -> set[str]:
    return set(re.findall(r"--build-arg ([A-Za-z_][A-Za-z0-9_]*)=", text))


def _declared_args() -> set[str]:
    return {
        m
        for f in (ROOT / "docker").glob("*.Dockerfile")
        for m in re.findall(r"(?m)^ARG ([A-Za-z_][A-Za-z0-9_]*)", f.read_text())
    }


def test_every_build_arg_the_docs_give_is_declared() -> None:
    texts = [*DOCS, *sorted(SAMPLES.glob("*.yaml"))]
    given = {(f.relative_to(ROOT).as_posix(), a) for f in texts for a in _build_args(f.read_text())}
    assert given, "no --build-arg found: the check reads nothing"
    declared = _declared_args()
    undeclared = sorted((f, a) for f, a in given if a not in declared)
    assert not undeclared, f"build arguments no Dockerfile declares (docker ignores them): {undeclared}"


def test_the_build_arg_check_can_fail() -> None:
    assert _build_args("docker build --build-arg RAY_TAG=x --build-arg PIP_NO_INDEX=1 .") == {"RAY_TAG", "PIP_NO_INDEX"}
    assert "RAY_TAG" not in _declared_args() and "RAY_IMAGE" in _declared_args()


# ---- config/samples/complete.txtpb sets every field of the schema --------------------


def _schema_fields(descriptor: Any, seen: set[str] | None = None) -> set[str]:
    """Every `Message.field` reachable from `descriptor` (a message Descriptor) within
    servegraph.v1; a map's values count as the map's field's (its entry type is not a
    message of the schema)."""
    seen = set() if seen is None else seen
    if descriptor.full_name in seen or not descriptor.full_name.startswith("servegraph.v1."):
        return set()
    seen.add(descriptor.full_name)
    fields: set[str] = set()
    for field in descriptor.fields:
        fields.add(f"{descriptor.name}.{field.name}")
        target = field.message_type
        if target is not None and target.GetOptions().map_entry:
            target = target.fields_by_name["value"].message_type
        if target is not None:
            fields |= _schema_fields(target, seen)
    return fields


def _set_fields(message: Message) -> set[str]:
    """Every `Message.field` set somewhere in `message`: a scalar not at its default,
    a present message, a repeated field or map with at least one entry."""
    descriptor = message.DESCRIPTOR
    if not descriptor.full_name.startswith("servegraph.v1."):
        return set()
    found: set[str] = set()
    for field, value in message.ListFields():
        found.add(f"{descriptor.name}.{field.name}")
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            children = list(value.values()) if field.message_type.fields_by_name["value"].message_type else []
        elif field.is_repeated:
            children = list(value)
        else:
            children = [value]
        for child in children:
            found |= _set_fields(child)
    return found


def test_the_complete_sample_sets_every_field_of_the_schema() -> None:
    from google.protobuf import text_format

    from servegraph.v1 import graph_pb2

    graph = text_format.Parse((SAMPLES / "complete.txtpb").read_text(), graph_pb2.Graph())
    unset = _schema_fields(graph_pb2.Graph.DESCRIPTOR) - _set_fields(graph)
    assert not unset, f"config/samples/complete.txtpb is 'every field of the schema' but sets none of {sorted(unset)}"


def test_the_field_check_can_fail() -> None:
    from servegraph.v1 import graph_pb2

    schema = _schema_fields(graph_pb2.Graph.DESCRIPTOR)
    assert {"Switch.field", "Switch.header", "NodeRef.optional", "Autoscaling.downscale_delay_s"} <= schema
    graph = graph_pb2.Graph(name="g")
    graph.applications.add().nodes["a"].switch.header = "x"
    assert _set_fields(graph) == {
        "Graph.name",
        "Graph.applications",
        "Application.nodes",
        "Node.switch",
        "Switch.header",
    }
