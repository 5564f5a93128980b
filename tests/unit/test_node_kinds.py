"""Node kinds are a closed set: a new one fails type checking in every module that forgot it.

Each `match` on a kind ends in `case _: assert_never(kind)`. Without it, a graph using a new
router kind would fail at run time in whichever module it happened to reach first (the
runtime's builder inside Ray, `servegraph status`), or worse, go through a match silently.
The last test adds a kind to a copy of the package and runs mypy on it: every such match
must be named.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from support import ROOT

from servegraph.dag.model import DeploymentKind, NodeKind, RouterKind
from servegraph.dag.nodeargs import ROUTER_KINDS
from servegraph.v1 import graph_pb2

PACKAGE = ROOT / "src" / "servegraph"
KIND_NAMES = frozenset(k.__name__ for k in (DeploymentKind, *get_args(RouterKind)))


@dataclass(frozen=True)
class KindMatch:
    module: str
    """Its path in the package: `dag/model.py`."""
    line: int
    subject: str
    closing: ast.match_case

    @property
    def where(self) -> str:
        return f"{self.module}:{self.line}"

    def closed(self) -> bool:
        """Whether its last case is `case _: assert_never(<the subject>)`."""
        case = self.closing
        if not (isinstance(case.pattern, ast.MatchAs) and case.pattern.pattern is None and case.guard is None):
            return False
        call = case.body[0].value if len(case.body) == 1 and isinstance(case.body[0], ast.Expr) else None
        return (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Name)
            and call.func.id == "assert_never"
            and [ast.unparse(a) for a in call.args] == [self.subject]
        )


def _class_names(pattern: ast.pattern) -> set[str]:
    names = set()
    for sub in ast.walk(pattern):
        if isinstance(sub, ast.MatchClass):
            cls = sub.cls
            names.add(cls.attr if isinstance(cls, ast.Attribute) else ast.unparse(cls))
    return names


def kind_matches(package: Path = PACKAGE) -> list[KindMatch]:
    """Every `match` in the package with a case naming a node kind's class."""
    found = []
    for path in sorted(package.rglob("*.py")):
        module = path.relative_to(package).as_posix()
        if module.startswith("v1/"):
            continue  # generated
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Match) and any(_class_names(c.pattern) & KIND_NAMES for c in node.cases):
                found.append(KindMatch(module, node.lineno, ast.unparse(node.subject), node.cases[-1]))
    return found


def test_the_schema_the_model_and_the_runtime_args_know_the_same_kinds() -> None:
    """graph.proto's `kind` oneof, the model's union and the args' router keys: one set of names."""
    schema = {f.name for f in graph_pb2.Node.DESCRIPTOR.oneofs_by_name["kind"].fields}
    model = {k.__name__.removesuffix("Kind").lower() for k in get_args(NodeKind)}
    assert schema == model, "a kind in graph.proto and not in dag/model.py's NodeKind, or the reverse"
    assert set(ROUTER_KINDS) == model - {"deployment"}, "dag/nodeargs.py's ROUTER_KINDS"


def test_every_match_on_a_kind_ends_in_assert_never() -> None:
    matches = kind_matches()
    modules = {m.module for m in matches}
    # The scan finds what it must (it would pass vacuously on finding nothing).
    assert {"dag/model.py", "dag/rules.py", "runtime/builder.py", "statustree/tree.py"} <= modules, modules
    open_ones = [m.where for m in matches if not m.closed()]
    assert not open_ones, f"end these with `case _: assert_never(<subject>)`: {open_ones}"


def test_the_architecture_doc_names_every_module_a_new_kind_touches() -> None:
    """Its "a router kind" row: the model, the proto's reader and every module matching on a kind."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    (row,) = [line for line in doc.splitlines() if line.startswith("| a router kind |")]
    wanted = {"dag/model.py", "graph/nodes.py", "runtime/routers.py"} | {m.module for m in kind_matches()}
    missing = [m for m in sorted(wanted) if f"`{m}`" not in row]
    assert not missing, f"docs/architecture.md's router kind row does not name {missing}"


def test_mypy_names_every_match_a_new_kind_would_miss(tmp_path: Path) -> None:
    """A copy of the package with one more router kind: mypy reports each kind match, at its
    `assert_never`, and only there (this is what a contributor adding a kind will see)."""
    copy = tmp_path / "src"
    shutil.copytree(PACKAGE, copy / "servegraph", ignore=shutil.ignore_patterns("__pycache__"))
    model = copy / "servegraph" / "dag" / "model.py"
    text = model.read_text()
    union = "RouterKind: TypeAlias = SequenceKind | EnsembleKind | SwitchKind | SplitterKind\n"
    assert text.count(union) == 1, "dag/model.py spells RouterKind otherwise: update this test's probe"
    probe = (
        "@dataclass(frozen=True, slots=True)\n"
        "class ProbeKind(_RouterKind):\n"
        "    targets: tuple[str, ...] = ()\n"
        "    calls: tuple[Call, ...] = ()\n\n\n"
    )
    model.write_text(text.replace(union, probe + union.replace("\n", " | ProbeKind\n")))
    matches = kind_matches(copy / "servegraph")
    modules = sorted({"servegraph." + m.module.removesuffix(".py").replace("/", ".") for m in matches})
    argv = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")]
    argv += ["--cache-dir", str(tmp_path / "cache"), "--no-error-summary", "--show-absolute-path"]
    argv += [arg for module in modules for arg in ("-m", module)]
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    reported = {}
    for line in out.stdout.splitlines():
        where, _, message = line.partition(": error: ")
        if message:
            reported[where] = message
    assert reported, f"mypy found nothing to report:\n{out.stdout}{out.stderr}"
    expected = {}
    for m in matches:
        line = m.closing.body[0].lineno
        expected[f"{copy / 'servegraph' / m.module}:{line}"] = m.where
    missed = [where for path, where in expected.items() if "ProbeKind" not in reported.get(path, "")]
    assert not missed, f"mypy did not name these kind matches:\n{missed}\nit said:\n{out.stdout}"
    others = sorted(set(reported) - set(expected))
    assert not others, f"errors beyond the kind matches (is the copy type-clean?):\n{out.stdout}"
