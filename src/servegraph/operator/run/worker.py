"""The workers: take ServeGraph keys off the queue and reconcile them, forever."""

from __future__ import annotations

import asyncio
import logging

from servegraph.names import Key
from servegraph.operator.fetch import parsing
from servegraph.operator.queue import WorkQueue
from servegraph.operator.reconcile import Reconciler, RetryLater

log = logging.getLogger("servegraph.operator")


async def run_worker(reconciler: Reconciler, queue: WorkQueue[Key]) -> None:
    """Take keys off the queue forever; failures back off per key."""
    while True:
        key = await queue.get()
        parsing.TENANT.set(key[0])  # graph parses are shared round robin by namespace
        try:
            delay = await reconciler.reconcile(key)
        except RetryLater:
            queue.retry(key)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("[%s/%s] reconcile failed", *key)
            queue.retry(key)
        else:
            queue.forget(key)
            if delay is not None:
                queue.add_after(key, delay)
        finally:
            queue.done(key)
