"""Loading the bench's pure modules (bench/ is scripts, not a package) for their unit tests."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from support import ROOT


def load(name: str) -> ModuleType:
    """bench/<name>.py as module `<name>`, once per session."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
