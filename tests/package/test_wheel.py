"""The built wheel, in virtualenvs that hold only what it declares.

Each venv gets the wheel plus the dependency closure of one extra (none, `operator`,
`ray`), taken from the packages already installed here (symlinked, so no network
and a few seconds per venv). Every module of the wheel must import in the venv of
the extra it belongs to; a command run without its extra must say, in one line,
which extra to install. This is what catches an undeclared import (the wheel once
imported `cryptography` without declaring it) before a user does.
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
from support import ROOT, SAMPLES

# Which extra's venv each module must import in; every other module imports in the core.
EXTRA_OF = {
    "servegraph.source": "operator",
    "servegraph.kube": "operator",
    "servegraph.statustree.gather": "operator",
    "servegraph.operator": "operator",
    # the canary's evidence readers are HTTP clients the operator runs; what they return is core
    "servegraph.evidence.prometheus": "operator",
    "servegraph.evidence.routers": "operator",
    "servegraph.raydash": "ray",
    "servegraph.runtime": "ray",
    "servegraph.examples": "ray",
    # grpcio comes with ray[serve]: the generated stubs import it, Serve's gRPC proxy imports them.
    "servegraph.v1.service_pb2_grpc": "ray",
}
# What the CLI imports to list `up` and `down` (the dashboard defaults): core, whatever is installed.
CLI_MODULES = {"servegraph.raydash"}
PROFILES = ("", "operator", "ray")


def extra_of(module: str) -> str:
    if module in CLI_MODULES:
        return ""
    for prefix, extra in EXTRA_OF.items():
        if module == prefix or module.startswith(prefix + "."):
            return extra
    return ""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from what the images' build contexts send: pyproject.toml, README.md and src/."""
    tree = tmp_path_factory.mktemp("tree")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = tmp_path_factory.mktemp("dist")
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(tree)]
    subprocess.run(build, check=True, capture_output=True, timeout=300)
    (found,) = out.glob("servegraph-*.whl")
    return found


def _metadata(wheel: Path) -> tuple[list[str], list[str]]:
    """(Requires-Dist lines, module names) of the wheel."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        requires = [
            line.split(":", 1)[1].strip()
            for line in z.read(meta).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    modules = sorted(
        n[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        for n in names
        if n.startswith("servegraph/") and n.endswith(".py")
    )
    return requires, modules


def _closure(requirements: list[Requirement], extra: str) -> list[importlib.metadata.Distribution]:
    """The installed distributions `requirements` (for `extra`) need, transitively."""
    todo = [(r, extra) for r in requirements]
    done: dict[str, set[str]] = {}
    dists: dict[str, importlib.metadata.Distribution] = {}
    while todo:
        req, wanted = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": wanted}):
            continue
        name = canonicalize_name(req.name)
        extras = set(req.extras)
        if name in done and extras <= done[name]:
            continue
        done.setdefault(name, set()).update(extras)
        dist = dists.setdefault(name, importlib.metadata.distribution(req.name))
        for line in dist.requires or []:
            sub = Requirement(line)
            todo += [(sub, e) for e in (sorted(extras) or [""])]
    return list(dists.values())


def _make_venv(path: Path, wheel: Path, dists: list[importlib.metadata.Distribution]) -> Path:
    venv.EnvBuilder(with_pip=False, symlinks=True).create(path)
    python = path / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    for dist in dists:
        for file in dist.files or []:
            if file.parts[0] == "..":  # console scripts live outside site-packages
                continue
            target = site / file
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(Path(str(dist.locate_file(file))))
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    return python


@pytest.fixture(scope="module")
def pythons(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The interpreter of one venv per extra ("" is the core)."""
    requires, _ = _metadata(wheel)
    requirements = [Requirement(r) for r in requires]
    return {
        extra: _make_venv(tmp_path_factory.mktemp(f"venv-{extra or 'core'}"), wheel, _closure(requirements, extra))
        for extra in PROFILES
    }


def _run(python: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Isolated (-I): no PYTHONPATH, no user site, not the current directory."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run([str(python), "-I", *args], capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


PROBE = """
import importlib, json, sys
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(failed))
"""


@pytest.mark.parametrize("extra", PROFILES, ids=lambda e: e or "core")
def test_every_module_imports_with_only_what_its_extra_declares(
    wheel: Path, pythons: dict[str, Path], extra: str
) -> None:
    _, modules = _metadata(wheel)
    mine = [m for m in modules if extra_of(m) == extra]
    assert mine, f"no module belongs to {extra or 'the core'}"
    out = _run(pythons[extra], "-c", PROBE, *mine)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {}


def test_the_venvs_hold_only_the_declared_closure(pythons: dict[str, Path]) -> None:
    """Guards the test itself: the core venv really lacks the extras' packages."""
    out = _run(
        pythons[""],
        "-c",
        "import importlib.util as u; print([m for m in ('kopf', 'aiohttp', 'ray', 'cryptography', 'servegraph_testbed') if u.find_spec(m)])",
    )
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.parametrize(
    ("argv", "extra", "module"),
    [
        (["run"], "operator", "kopf"),
        (["up", str(SAMPLES / "mini.txtpb")], "ray", "aiohttp"),
        (["down"], "ray", "aiohttp"),
        (["status", "fraud"], "operator", "kubernetes_asyncio"),
        (["call", "--grpc", "127.0.0.1:9000", "--app", "a", "{}"], "ray", "grpc"),
    ],
)
def test_a_command_without_its_extra_says_which_to_install(
    pythons: dict[str, Path], tmp_path: Path, argv: list[str], extra: str, module: str
) -> None:
    out = _run(pythons[""], "-m", "servegraph.cli", *argv, cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr == (
        f"servegraph {argv[0]}: needs the {extra!r} extra (no module named {module!r}): "
        f"pip install 'servegraph[{extra}]'\n"
    )


def test_the_core_validates_renders_and_packs(pythons: dict[str, Path], tmp_path: Path) -> None:
    python = pythons[""]
    assert _run(python, "-m", "servegraph.cli", "validate", str(SAMPLES / "complete.txtpb")).returncode == 0
    # --pods checks the ServeGraph against the CRD's schema, shipped in the wheel.
    fits = _run(
        python, "-m", "servegraph.cli", "validate", str(SAMPLES / "mini.txtpb"), "--pods", str(SAMPLES / "mini.yaml")
    )
    assert fits.returncode == 0 and "fits the pods of ServeGraph mini" in fits.stdout, fits.stderr
    rendered = _run(python, "-m", "servegraph.cli", "render", str(SAMPLES / "mini.pb"))
    assert rendered.returncode == 0 and "kind: RayService" in rendered.stdout
    packed = _run(
        python, "-m", "servegraph.cli", "pack", str(SAMPLES / "mini.txtpb"), "--output", str(tmp_path / "m.pb")
    )
    assert packed.returncode == 0, packed.stderr
    assert (tmp_path / "m.pb").read_bytes() == (SAMPLES / "mini.pb").read_bytes()


def test_the_wheel_holds_what_users_run_and_declares_what_it_imports(wheel: Path) -> None:
    requires, modules = _metadata(wheel)
    with zipfile.ZipFile(wheel) as z:
        top = {n.split("/", 1)[0] for n in z.namelist()}
    assert top == {"servegraph", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    assert not [m for m in modules if any(w in m for w in ("testbed", "testenv", "registry", "demo"))]
    core = {canonicalize_name(Requirement(r).name) for r in requires if Requirement(r).marker is None}
    assert core == {"protobuf", "pyyaml", "orjson"}
