"""The import graph of src/servegraph points only down the flow (docs/architecture.md).

event → fetch → graph → render → apply → status: a package may import the
packages before it, never one after it, and never a sibling of its own layer.
Every import counts, also one inside a function or under TYPE_CHECKING: a lazy
import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support import ROOT

SRC = ROOT / "src" / "servegraph"
TESTBED = ROOT / "testbed" / "servegraph_testbed"

# Down the flow, first to last. Each entry is one layer: the packages (or top-level
# modules) in it, named by their first component under servegraph.
LAYERS: list[tuple[str, set[str]]] = [
    ("foundation: names, extras, the GC pause, the wire schema", {"__init__", "names", "extras", "gcpause", "v1"}),
    ("the DAG model and the runtime's args codec (standard library only)", {"dag"}),
    # The runtime runs what render wrote, inside Ray: beside the flow, it may use only the
    # DAG (test_runtime_imports.py also holds it to ray and the standard library).
    ("the runtime, inside Ray", {"runtime"}),
    ("sample deployments for the runtime", {"examples"}),
    ("fetch", {"source"}),
    ("graph", {"graph"}),
    ("render", {"render"}),
    ("apply: to Kubernetes, or straight to a Ray dashboard; and what serving did", {"kube", "raydash", "evidence"}),
    ("`servegraph status`: reads back what the operator, KubeRay and Ray Serve report", {"statustree"}),
    ("status: the operator, which composes all of the above", {"operator"}),
    # Calls a graph once it serves: beside the flow, it needs only the wire schema.
    ("a client of served graphs over gRPC", {"grpc_client"}),
    ("the command line", {"cli"}),
]
LAYER = {package: i for i, (_, packages) in enumerate(LAYERS) for package in packages}
MAX_LINES = 400

# Inside the operator, the same rule: its units stand in one order, bottom first, and a module
# may import only its own unit and those below. At the bottom, the values the reconcile's stages
# hand each other (each of those modules in order too); then the stages in the order a reconcile
# runs them; then their composition, the reconcile, and the running process that wires it.
OPERATOR_SHARED = [
    "conditions",
    "packed",
    "parsed",
    "kuberay",
    "values",
    "secrets",
    "serve_service",
    "gateways",
    "spec",
    "protocols",
    "graph_metrics",
    "metrics",
    "queue",
    "cache",
    "unexpected",
]
OPERATOR_UNITS: list[tuple[str, set[str]]] = [
    *((f"the shared values: {m}", {m}) for m in OPERATOR_SHARED),
    ("the fetch stage", {"fetch"}),
    ("the rollout stage", {"rollout"}),
    ("the render and apply stages", {"apply"}),
    ("the status stage", {"status"}),
    ("ownership → rollout → render → apply, composed", {"deploying"}),
    ("the reconcile", {"reconcile"}),
    ("the running process: kopf, workers, leader election, servers", {"run"}),
]
OPERATOR_UNIT = {name: i for i, (_, names) in enumerate(OPERATOR_UNITS) for name in names}


def _package_of(module: str) -> str:
    """`servegraph.graph.validate` → `graph`; `servegraph` → `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _source_files() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "__pycache__" not in p.parts)


def _module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(source: str, here: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, servegraph module) of every import in the source of module `here`."""
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "servegraph"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = here.split(".") if is_package else here.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if module.split(".")[0] != "servegraph":
                continue
            for alias in node.names:  # `from servegraph import up` imports the module servegraph.up
                candidate = f"{module}.{alias.name}"
                sub = SRC.parent / Path(*candidate.split("."))
                found.append((node.lineno, candidate if sub.is_dir() or sub.with_suffix(".py").exists() else module))
    return sorted(found)


def test_every_package_has_a_place_in_the_flow() -> None:
    packages = {_package_of(_module_name(p)) for p in _source_files()}
    assert packages - set(LAYER) == set(), "add the new package to LAYERS and to docs/architecture.md"
    assert set(LAYER) - packages == set(), "a package in LAYERS no longer exists"


def test_imports_only_point_down_the_flow() -> None:
    wrong = []
    for path in _source_files():
        importer = _package_of(_module_name(path))
        for line, module in _imports(path.read_text(), _module_name(path), path.name == "__init__.py"):
            imported = _package_of(module)
            if imported == importer:
                continue
            if LAYER[imported] >= LAYER[importer]:
                where = f"{path.relative_to(ROOT)}:{line}"
                wrong.append(f"{where}: {importer} ({LAYERS[LAYER[importer]][0]}) imports {module}")
    assert wrong == []


def _operator_unit(module: str) -> str | None:
    """`servegraph.operator.apply.writer` → `apply`; None for the package itself."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "operator" else None


def test_every_operator_module_has_a_place_in_its_order() -> None:
    found = {_operator_unit(_module_name(p)) for p in (SRC / "operator").rglob("*.py")} - {None}
    assert found - set(OPERATOR_UNIT) == set(), "add the new module or package to OPERATOR_UNITS"
    assert set(OPERATOR_UNIT) - found == set(), "a unit in OPERATOR_UNITS no longer exists"


def test_operator_imports_only_point_down_its_order() -> None:
    """No stage imports a later one, the shared values import no stage, nothing imports `run`."""
    wrong = []
    for path in sorted((SRC / "operator").rglob("*.py")):
        here = _module_name(path)
        importer = _operator_unit(here)
        if importer is None:
            continue
        for line, module in _imports(path.read_text(), here, path.name == "__init__.py"):
            imported = _operator_unit(module)
            if imported is None or imported == importer:
                continue
            if OPERATOR_UNIT[imported] > OPERATOR_UNIT[importer]:
                unit = OPERATOR_UNITS[OPERATOR_UNIT[importer]][0]
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {importer} ({unit}) imports {module}")
    assert wrong == []


@pytest.mark.parametrize(
    ("importer", "imported"),
    [("fetch", "rollout"), ("rollout", "apply"), ("apply", "status"), ("reconcile", "run"), ("cache", "apply")],
)
def test_the_operator_arrows_the_issue_names_stay_forbidden(importer: str, imported: str) -> None:
    """The back-up imports issue 43 found (download → rollout.store, step → apply, cache → apply,
    the reconcile → run/) must stay refused whatever OPERATOR_UNITS becomes."""
    assert OPERATOR_UNIT[imported] > OPERATOR_UNIT[importer]


@pytest.mark.parametrize(
    ("importer", "imported"),
    [("kube", "operator"), ("graph", "render"), ("runtime", "render"), ("dag", "graph"), ("render", "operator")],
)
def test_the_rules_the_issue_names_are_among_the_checked_ones(importer: str, imported: str) -> None:
    """Guards the table itself: these arrows must stay forbidden whatever LAYERS becomes."""
    assert LAYER[imported] >= LAYER[importer]


def test_the_checker_sees_lazy_and_relative_imports() -> None:
    """An import inside a function is found, and so is `from . import x`."""
    source = "def f():\n    from servegraph.operator.run import app\n\nfrom . import client\nimport servegraph.names\n"
    assert _imports(source, "servegraph.kube.probe") == [
        (2, "servegraph.operator.run.app"),
        (4, "servegraph.kube.client"),
        (5, "servegraph.names"),
    ]


def _longer_than_max(files: list[Path]) -> dict[str, int]:
    return {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_LINES}


def test_modules_stay_short() -> None:
    """One job per module: past ~400 lines a module is doing two."""
    assert _longer_than_max([p for p in _source_files() if "v1" not in p.relative_to(SRC).parts]) == {}


def test_testbed_modules_stay_short() -> None:
    """The test bed is held to the same rule: every integration and node test reads it."""
    files = sorted(p for p in TESTBED.rglob("*.py") if "__pycache__" not in p.parts)
    assert len(files) > 20  # the walk found the package
    assert _longer_than_max(files) == {}
