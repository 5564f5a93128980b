"""pytest plugin: a terminated test run tears down like an interrupted one.

Everything the test bed starts runs in its own session (so a terminal's Ctrl-C reaches
only pytest, which then stops it in order). SIGTERM — CI's timeout, `kill`, a closed
job — would otherwise end pytest on the spot: no fixture teardown, no atexit, and etcd,
the API server and a whole node with its network left running. Handing SIGTERM to SIGINT's
handler gives it the one teardown path Ctrl-C already takes, whatever owns SIGINT at the
time (pytest's KeyboardInterrupt, or asyncio's runner cancelling the running test); when
SIGINT is ignored (a job a shell started in the background), it raises KeyboardInterrupt.
"""

from __future__ import annotations

import signal
from types import FrameType

import pytest


def _interrupt(signum: int, frame: FrameType | None) -> None:
    on_sigint = signal.getsignal(signal.SIGINT)
    if callable(on_sigint):
        on_sigint(signal.SIGINT, frame)
    else:  # SIGINT ignored (started in the background by a shell): what Ctrl-C would raise
        raise KeyboardInterrupt


@pytest.hookimpl
def pytest_configure(config: pytest.Config) -> None:
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # not when someone already handles it
        signal.signal(signal.SIGTERM, _interrupt)
