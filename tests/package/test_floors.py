"""The lowest versions the wheel declares are versions the code is proven on.

A bare venv gets the wheel and, for the core and the `operator` extra, exactly the floor
of each requirement (`>=X` installed as `==X`: the floor must be a real release), then
runs what depends on them: the source tests (aiohttp and yarl under the guard and the
client, against real HTTPS servers, the gzip bomb included), the unit tests of the
graph decoder (protobuf), kopf's settings and the internals it relies on, leader election (kubernetes_asyncio), metrics
(prometheus-client) and the reconcile, and `servegraph run` on the real API server (the
source-policy integration tests: their operator process runs on the floors too). A floor too low fails here: `aiohttp>=3.11`
lacked the connector's socket_factory and let a 1 MB gzip bomb peak at 267 MiB;
`protobuf>=5.29` was older than the generated code, which refuses to import.

The first run downloads the floors from the package index into
~/.cache/servegraph/floors (pip's ordinary client); later runs install from there
without the network.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from support import ROOT
from support import testenv_dir as binaries_dir

CACHE = Path(os.environ.get("SERVEGRAPH_CACHE", Path.home() / ".cache" / "servegraph")) / "floors"
EXTRAS = ("", "operator")
# The test tools, at the versions the suite runs with here (they are not under test).
TOOLS = ("pytest", "pytest-asyncio", "pytest-timeout", "trustme", "cryptography")
TESTS = [
    "tests/source",
    "tests/unit/test_decode.py",
    "tests/unit/test_kopf_settings.py",
    "tests/unit/test_kopf_private.py",  # kopf's internals, on the floor as on the newest allowed
    "tests/unit/test_leader.py",
    "tests/unit/test_operator_metrics.py",
    "tests/unit/test_reconcile.py",
    "tests/unit/test_reconcile_security.py",
    # `servegraph run` itself on the floors (kopf, kubernetes_asyncio, aiohttp) against the
    # real API server, under the source policy.
    "tests/integration/test_security_sources.py",
    "tests/integration/test_security_tenants.py",
]
PYTEST_INI = """[pytest]
asyncio_mode = auto
asyncio_default_fixture_loop_scope = session
asyncio_default_test_loop_scope = session
pythonpath = {tests}
timeout = 600
markers =
    integration: needs the real control plane
"""


def floors(requires: list[str]) -> dict[str, str]:
    """name -> the `>=` bound of each requirement of the core and the operator extra."""
    found: dict[str, str] = {}
    for line in requires:
        req = Requirement(line)
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in EXTRAS):
            continue
        lower = [s.version for s in req.specifier if s.operator == ">="]
        assert len(lower) == 1, f"{line}: declare exactly one floor (>=)"
        found[canonicalize_name(req.name)] = lower[0]
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = tmp_path_factory.mktemp("tree")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("dist")
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(tree)]
    subprocess.run(build, check=True, capture_output=True, timeout=300)
    (found,) = out.glob("servegraph-*.whl")
    return found


def _requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    return [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]


def _pip(python: Path, *args: str) -> None:
    out = subprocess.run([str(python), "-m", "pip", "-q", *args], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.fixture(scope="module")
def floor_python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    pins = floors(_requires(wheel))
    wanted = [f"{name}=={version}" for name, version in sorted(pins.items())]
    wanted += [f"{tool}=={importlib.metadata.version(tool)}" for tool in TOOLS]
    where = tmp_path_factory.mktemp("venv-floors")
    venv.EnvBuilder(with_pip=True, symlinks=True).create(where)
    python = where / "bin" / "python"
    CACHE.mkdir(parents=True, exist_ok=True)
    offline = ["--no-index", f"--find-links={CACHE}"]
    try:
        _pip(python, "install", *offline, *wanted)
    except AssertionError:  # not all in the cache yet: fetch them once from the index
        _pip(python, "download", "--dest", str(CACHE), *wanted)
        _pip(python, "install", *offline, *wanted)
    _pip(python, "install", "--no-deps", str(wheel))
    # The test bed (the registry the source tests run), from the tree, as the suite imports it.
    site = subprocess.run(
        [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(site) / "servegraph-testbed.pth").write_text(str(ROOT / "testbed") + "\n")
    return python, pins


def test_the_declared_floors_are_what_is_installed(floor_python: tuple[Path, dict[str, str]]) -> None:
    python, pins = floor_python
    probe = "import importlib.metadata as m, json, sys; print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    out = subprocess.run([str(python), "-I", "-c", probe, *pins], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    installed = {canonicalize_name(n): Version(v) for n, v in json.loads(out.stdout).items()}
    assert installed == {n: Version(v) for n, v in pins.items()}
    assert {"aiohttp", "yarl", "protobuf", "kopf", "kubernetes-asyncio", "prometheus-client"} <= set(pins)


def test_the_tests_of_what_uses_them_pass_on_the_floors(
    floor_python: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    python, _ = floor_python
    ini = tmp_path / "pytest.ini"
    ini.write_text(PYTEST_INI.format(tests=ROOT / "tests"))
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    env["SERVEGRAPH_TESTENV"] = str(binaries_dir())  # the control plane's binaries, as tests/integration uses
    argv = [str(python), "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ini), "--rootdir", str(ROOT)]
    out = subprocess.run(
        [*argv, *(str(ROOT / t) for t in TESTS)], capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


def test_the_protobuf_floor_is_not_older_than_the_generated_code(wheel: Path) -> None:
    """The generated module refuses a runtime older than the protoc that wrote it."""
    gencode = (ROOT / "src" / "servegraph" / "v1" / "graph_pb2.py").read_text()
    version = next(line.split(":", 1)[1].strip() for line in gencode.splitlines() if "Protobuf Python Version" in line)
    floor = floors(_requires(wheel))["protobuf"]
    assert Requirement(f"protobuf>={version}").specifier.contains(floor), (
        f"protobuf>={floor} is declared, the gencode needs {version}"
    )
