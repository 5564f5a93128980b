"""One machine-wide lock per shared thing the test bed builds or takes (a flock on a file)."""

from __future__ import annotations

import contextlib
import fcntl
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path` (created if missing) for the block; a second
    holder waits. The kernel releases it if the process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def take(path: Path, *, wait_s: float, waiting: str, holder: str) -> TextIO:
    """An exclusive flock on `path`, held until the returned file is closed.

    A second taker waits, printing `waiting` once to stderr; after `wait_s` it gives up
    with a TimeoutError naming the `holder`.
    """
    f = path.open("a")
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return f
        except BlockingIOError:
            if not said:
                print(waiting, file=sys.stderr)
                said = True
            if time.monotonic() > deadline:
                f.close()
                raise TimeoutError(f"{holder} held {path} for {wait_s:.0f} s") from None
            time.sleep(1)
