"""Deleting a suspended ServeGraph's RayService (`spec.suspend`; rollout/suspension.py decides).

Decided on the object as read, the delete carrying its uid and resourceVersion as
preconditions (apply/ownership.py): a RayService someone else controls is never deleted.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from servegraph.kube import KubeError
from servegraph.names import ConditionType, Key
from servegraph.operator.apply.ownership import NotOurs, delete_owned
from servegraph.operator.cache import WatchCache
from servegraph.operator.conditions import Condition
from servegraph.operator.kuberay import Live
from servegraph.operator.protocols import RayServiceApi
from servegraph.operator.values import Outcome

log = logging.getLogger("servegraph.operator")

DELETE_ATTEMPTS = 2
"""Deletes per reconcile when the RayService changed between the read and the delete."""


@dataclass(frozen=True)
class Removed:
    """Whether a delete was sent, and what the step found (a failure said in Applied, retried)."""

    deleted: bool
    found: Outcome


async def remove(
    api: RayServiceApi, cache: WatchCache, key: Key, name: str, body: Mapping[str, Any], live: Live | None
) -> Removed:
    """Delete the ServeGraph's RayService unless it is gone or going."""
    if live is None or live.deleting:
        return Removed(False, Outcome())
    for attempt in range(DELETE_ATTEMPTS):
        try:
            deleted = await delete_owned(api, key[0], name, body["metadata"]["uid"])
        except NotOurs as exc:
            failed = Condition(ConditionType.APPLIED, False, "Conflict", exc.reason)
        except KubeError as exc:
            if exc.status == 409 and attempt + 1 < DELETE_ATTEMPTS:
                continue  # changed since it was read (KubeRay's status): read it again, decide again
            reason = "Conflict" if exc.status == 409 else "DeleteFailed"
            failed = Condition(ConditionType.APPLIED, False, reason, str(exc))
        else:
            if deleted:
                cache.put_rayservice((key[0], name), replace(live, deleting=True))  # the watch will say so too
                log.info("[%s/%s] suspended: deleted RayService %s", *key, name)
            return Removed(deleted, Outcome())
        break
    return Removed(False, Outcome(applied=failed, retry=True))
