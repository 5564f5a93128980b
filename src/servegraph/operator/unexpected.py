"""A step that failed in a way nobody foresaw: logged whole, counted, said by type only.

Every step of a reconcile ends the same way on an exception it did not expect: a
condition naming the exception's type and the step (never its message, which could
carry anything: a token in a URL, a Secret's value), the Warning Event of that
transition, `servegraph_internal_errors_total` and a retry with backoff.
"""

from __future__ import annotations

import logging

from servegraph.names import ConditionType, Key
from servegraph.operator.conditions import Condition
from servegraph.operator.metrics import Metrics
from servegraph.operator.values import Outcome

log = logging.getLogger("servegraph.operator")

# Each step of a reconcile: the condition its unexpected exception is reported in, and what it was doing.
STEPS: dict[str, tuple[ConditionType | None, str]] = {
    "spec": (ConditionType.FETCHED, "reading the spec"),
    "download": (ConditionType.FETCHED, "downloading"),
    "ownership": (ConditionType.APPLIED, "checking who owns the RayService"),
    "rollout": (ConditionType.APPLIED, "planning the rollout"),
    "render": (ConditionType.APPLIED, "rendering the RayService"),
    "apply": (ConditionType.APPLIED, "applying the RayService"),
    "status": (None, "writing the status"),
}


def unexpected(key: Key, step: str, exc: Exception, metrics: Metrics) -> Outcome:
    """Log it whole for the administrator, count it, and say in the step's condition which
    exception it was; retried."""
    log.error("[%s/%s] unexpected %s while %s", *key, type(exc).__name__, STEPS[step][1], exc_info=exc)
    metrics.internal_error(step, exc)
    kind = STEPS[step][0]
    if kind is None:
        return Outcome(retry=True)
    cond = Condition(kind, False, "InternalError", message(exc, step))
    return Outcome(fetched=cond, retry=True) if kind == ConditionType.FETCHED else Outcome(applied=cond, retry=True)


def message(exc: Exception, step: str) -> str:
    return f"unexpected {type(exc).__name__} while {STEPS[step][1]}; the operator's log has the details"
