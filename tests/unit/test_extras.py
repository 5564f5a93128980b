"""Optional extras: a missing one is one line naming it, never a vanished command."""

from __future__ import annotations

import subprocess
import sys

import pytest

from servegraph.extras import MissingExtra, needs_extra


def test_a_missing_third_party_module_names_the_extra_to_install() -> None:
    with pytest.raises(MissingExtra) as raised, needs_extra("operator"):
        import servegraph_no_such_dependency  # type: ignore[import-not-found]  # noqa: F401
    assert str(raised.value) == (
        "needs the 'operator' extra (no module named 'servegraph_no_such_dependency'): "
        "pip install 'servegraph[operator]'"
    )


def test_a_missing_servegraph_module_is_a_broken_install_not_an_extra() -> None:
    with pytest.raises(ModuleNotFoundError) as raised, needs_extra("operator"):
        import servegraph.no_such_module  # type: ignore[import-not-found]  # noqa: F401
    assert not isinstance(raised.value, MissingExtra)


def test_every_command_is_listed_whatever_is_installed() -> None:
    """`run`, `fetch`, `up`, `down`, `status` and `restart` are registered by modules that import only the standard
    library; `call` by one that imports grpcio only when it calls."""
    probe = (
        "import sys; import servegraph.cli.main as cli; parser = cli._parser(); "
        "heavy = sorted(m for m in ('kopf', 'aiohttp', 'kubernetes_asyncio', 'ray', 'grpc') if m in sys.modules); "
        "choices = parser._subparsers._group_actions[0].choices; print(sorted(choices), heavy)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "['abort', 'call', 'canary', 'completion', 'diff', 'down', 'fetch', 'inspect', 'pack', 'promote', 'render', 'restart', 'rollback', 'run', 'status', 'up', 'validate'] []"
    )
