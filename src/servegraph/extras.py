"""Which optional extra a command needs, said in one line when it is missing.

The wheel's core (validate, render, inspect, pack) needs only protobuf, PyYAML
and orjson; `servegraph run` needs the `operator` extra and `servegraph up` the
`ray` extra. Their commands are always listed, and their modules import the
extra's packages inside `needs_extra`, so a missing one becomes `MissingExtra`
(the CLI prints it as one line) rather than a traceback or a vanished command.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


class MissingExtra(ImportError):
    """A package of an optional extra is not installed."""

    def __init__(self, extra: str, module: str) -> None:
        super().__init__(f"needs the {extra!r} extra (no module named {module!r}): pip install 'servegraph[{extra}]'")
        self.extra = extra
        self.module = module


@contextlib.contextmanager
def needs_extra(extra: str) -> Iterator[None]:
    """Turn a third-party module missing from the imports in the block into MissingExtra.

    A servegraph module missing is a broken install, not a missing extra: it propagates.
    """
    try:
        yield
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if not missing or missing.split(".")[0] == "servegraph":
            raise
        raise MissingExtra(extra, missing) from None
