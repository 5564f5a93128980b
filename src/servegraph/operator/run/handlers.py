"""The operator's whole event surface, on one screen: kopf decorators only.

Every watch handler just tells the reconciler what changed; the reconcile runs
on the work queue. Handlers are `async def` on purpose: kopf runs sync handlers
in threads, and the reconciler's caches and queue belong to the event loop. kopf stores no state on our objects (`on.event`
handlers and an index that keeps nothing, no finalizers, no annotations), so deleting a ServeGraph never waits
for the operator and a quiet cluster sees no writes from it.

There is no Secret watch: RBAC cannot narrow one to the Secrets ServeGraphs name, so
it would stream every Secret of the cluster. Tokens are read when a download needs
them (operator/secrets.py: SecretCache).
"""

from __future__ import annotations

import logging
from typing import Any

import kopf

from servegraph import gcpause
from servegraph.names import (
    GATEWAY_GROUP,
    GATEWAY_VERSION,
    GROUP,
    PLURAL,
    RAY_GROUP,
    RAY_PLURAL,
    RAY_VERSION,
    ROUTE_PLURAL,
    VERSION,
)
from servegraph.operator.run import app, kopf_settings
from servegraph.operator.run import login as run_login
from servegraph.operator.run.echoes import RAYSERVICE, SERVEGRAPH


@kopf.on.login()
async def login(memo: Any, **kwargs: Any) -> kopf.ConnectionInfo | None:
    if memo.options.context:  # `servegraph run --context`: kopf's own login reads only the current one
        return await run_login.at_context(memo.options.kubeconfig, memo.options.context)
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
async def startup(
    settings: kopf.OperatorSettings, memo: Any, logger: logging.Logger | logging.LoggerAdapter[Any], **_: Any
) -> None:
    kopf_settings.configure(settings, memo.options.shard.selector())
    memo.operator = await app.start(memo.options)
    # rayservice_index below: every RayService is delivered once before any ServeGraph is.
    memo.operator.reconciler.cache.rayservices_complete = True
    kopf_settings.drop_echoes(memo.operator.echoes.drop)  # before kopf starts its watches
    kopf_settings.compare_listings(memo.operator.reconciler)  # a re-list repairs what a watch gap hid
    gcpause.tune_for_service()
    logger.info("servegraph operator started")


@kopf.on.cleanup()
async def cleanup(memo: Any, **_: Any) -> None:
    kopf_settings.drop_echoes(None)
    kopf_settings.compare_listings(None)
    operator = getattr(memo, "operator", None)
    if operator is not None:
        await operator.stop()


@kopf.on.event(GROUP, VERSION, PLURAL)
async def servegraph_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    # The watch's selector leaves out other shards' ServeGraphs, and one relabelled away arrives
    # as DELETED; the client-side check keeps that true should an event slip through anyway.
    body = event["object"]
    memo.operator.echoes.handled(SERVEGRAPH, body)
    gone = event["type"] == "DELETED" or not memo.options.shard.owns(body)
    memo.operator.reconciler.servegraph_changed(body, deleted=gone)


@kopf.index(RAY_GROUP, RAY_VERSION, RAY_PLURAL)
async def rayservice_index(body: kopf.Body, memo: Any, **_: Any) -> None:
    """Every RayService, ours or not, as listed and then as it changes (not as deleted: below).

    An index handler, though it indexes nothing (None is not stored): kopf runs no other
    handler, no ServeGraph's, until every RayService its lists found has been through one.
    So the reconciler has seen every RayService that exists before its first reconcile, and
    creates one it never saw without reading it first (`WatchCache.rayservices_complete`);
    someone else's is known to be theirs (a `Conflict`) from its record.
    """
    memo.operator.echoes.handled(RAYSERVICE, body)
    memo.operator.reconciler.rayservice_changed(dict(body))


def _deleted(event: kopf.RawEvent, **_: Any) -> bool:
    return event["type"] == "DELETED"


@kopf.on.event(GATEWAY_GROUP, GATEWAY_VERSION, ROUTE_PLURAL)
async def httproute_event(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    """The operator's own HTTPRoutes (spec.expose; kopf_settings selects them by label). Without the
    Gateway API's CRDs at start there is nothing to watch, and nothing is."""
    memo.operator.reconciler.httproute_changed(event["object"], deleted=event["type"] == "DELETED")


# Only deletions: kopf calls no index handler for one. The filter, not a check in the handler,
# spares kopf invoking a handler (its kwargs, loggers, context) on every other RayService event.
@kopf.on.event(RAY_GROUP, RAY_VERSION, RAY_PLURAL, when=_deleted)
async def rayservice_deleted(event: kopf.RawEvent, memo: Any, **_: Any) -> None:
    memo.operator.echoes.handled(RAYSERVICE, event["object"])
    memo.operator.reconciler.rayservice_changed(event["object"], deleted=True)
