"""The one internal of Ray Serve the builder relies on still means what it did, on the Ray
installed: a release that changes it fails here, naming itself, not in a graph's build."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib

import pytest
import ray
from packaging.requirements import Requirement
from packaging.version import Version
from ray import serve
from support import ROOT

from servegraph.dag.args import BuildError
from servegraph.runtime import serve_internals
from servegraph.runtime.serve_internals import PROVEN, bound, rebind


def test_serve_still_builds_a_refilled_application_from_its_new_arguments() -> None:
    serve_internals.check()


def test_the_installed_ray_is_the_proven_release_and_the_one_the_extra_pins() -> None:
    installed = Version(importlib.metadata.version("ray"))
    assert installed.release[:2] == Version(PROVEN).release, (
        f"Ray {installed} is installed; runtime/serve_internals.py is proven on {PROVEN}: run its check and move PROVEN"
    )
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (declared,) = [Requirement(r) for r in extras["ray"] if Requirement(r).name == "ray"]
    major, minor = Version(PROVEN).release
    assert declared.specifier.contains(installed)
    assert not declared.specifier.contains(f"{major}.{minor + 1}.0"), f"{declared}: no Ray past the proven release"


@serve.deployment
class Leaf:
    def __init__(self, *args: object) -> None: ...


def test_a_ray_without_the_attribute_fails_the_build_naming_its_version() -> None:
    class Moved:
        """An Application as a Ray keeping its deployment elsewhere would make it."""

    with pytest.raises(BuildError, match=re.escape(f"Ray {ray.__version__} keeps no deployment")):
        rebind(Moved(), Leaf.bind())  # type: ignore[arg-type]
    with pytest.raises(BuildError, match=re.escape(f"as in Ray {PROVEN}")):
        bound(Moved())  # type: ignore[arg-type]


def test_rebind_keeps_the_object_and_takes_the_arguments() -> None:
    shell = Leaf.bind()
    rebind(shell, Leaf.bind(7))
    assert bound(shell).init_args == (7,)
