"""kopf's internals the operator relies on are still there, on the kopf installed: a release that
moves one fails here, naming itself, not in a running operator (tests/package/test_floors.py
runs this on the floor too)."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from typing import Any

import kopf
import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from support import ROOT

from servegraph.operator.run import kopf_private
from servegraph.operator.run.kopf_private import PROVEN, KopfChanged


def test_the_installed_kopf_has_every_internal_as_proven() -> None:
    kopf_private.check()


def test_the_installed_kopf_is_the_proven_release_and_the_only_one_allowed() -> None:
    """The bound declared for the operator extra is the proven minor release: a newer kopf is
    proven (this module's `check`, the suite) before the bound moves."""
    installed = Version(importlib.metadata.version("kopf"))
    assert installed.release[:2] == Version(PROVEN).release, (
        f"kopf {installed} is installed; kopf_private.py is proven on {PROVEN}: run its check and move PROVEN"
    )
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    (declared,) = [Requirement(r) for r in extras["operator"] if Requirement(r).name == "kopf"]
    major, minor = Version(PROVEN).release
    assert declared.specifier.contains(installed)
    assert not declared.specifier.contains(f"{major}.{minor + 1}.0"), f"{declared}: bound kopf below the next minor"
    assert not declared.specifier.contains(f"{major}.{minor - 1}.99"), f"{declared}: its floor is the proven release"


def test_a_moved_internal_names_the_installed_version() -> None:
    class Elsewhere:
        """A registry as a kopf keeping its handlers in another attribute would have it."""

    version = importlib.metadata.version("kopf")
    with pytest.raises(KopfChanged, match=re.escape(f"kopf {version} has no OperatorRegistry._changing")):
        kopf_private.changing_handlers(Elsewhere())  # type: ignore[arg-type]


def test_the_handler_registries_read_what_was_registered() -> None:
    registry = kopf.OperatorRegistry()

    @kopf.on.update("servegraph.io", "v1alpha1", "servegraphs", registry=registry, id="b")
    @kopf.on.field("servegraph.io", "v1alpha1", "servegraphs", field="spec", registry=registry, id="a")
    def changed(**_: Any) -> None: ...

    @kopf.on.event("servegraph.io", "v1alpha1", "servegraphs", registry=registry, id="w")
    def watched(**_: Any) -> None: ...

    assert kopf_private.changing_handlers(registry) == ["a/spec", "b"]  # a field handler's id names its field
    assert kopf_private.watching_handlers(registry) == ["w"]


def test_a_decoder_is_installed_once_and_not_over_another() -> None:
    """Installed over the standard library's json only: over anything else nothing is replaced."""

    class Decoder:
        @staticmethod
        def loads(text: str) -> Any:
            return {"decoded": text}

    from servegraph.operator.run import kopf_settings

    assert kopf_settings.decode_watch_events_with_orjson()
    installed = kopf_private.watch_loads()
    assert not kopf_private.install_watch_decoder(Decoder), "another decoder is in place: left as is"
    assert kopf_private.watch_loads() is installed
    assert installed('{"type": "BOOKMARK"}') == {"type": "BOOKMARK"}
