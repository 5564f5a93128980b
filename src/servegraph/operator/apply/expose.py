"""The expose step: a ServeGraph's HTTPRoute (`spec.expose`), owned and kept like its RayService.

The route (render/httproute.py) is named as its ServeGraph, which controls it (owner
reference: deleting the ServeGraph deletes it), and is written by server-side apply only when
the live one differs from the render (its spec-hash annotation, and its spec cut to the keys
rendered: what the API server defaults does not count). An edit or a deletion by hand comes
back on the watch (the operator's own routes only: `app.kubernetes.io/managed-by`) and is
repaired. An HTTPRoute of that name the ServeGraph does not control is never taken over
(`Conflict`), and `spec.expose` removed deletes the route, with uid and resourceVersion
preconditions. The Gateway decides whether to take the route: one it refuses (`Accepted`
False in the route's status, e.g. its listeners do not allow routes from this namespace) is
said in Applied. Which Gateways a ServeGraph may name is checked before (operator/gateways.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from servegraph.kube import KubeError
from servegraph.names import KIND, SPEC_HASH_ANNOTATION, ConditionType, Key
from servegraph.operator.conditions import Condition
from servegraph.operator.metrics import Metrics
from servegraph.operator.protocols import RouteApi
from servegraph.operator.spec import ServeGraphSpec, owner_reference
from servegraph.operator.values import Event, Outcome
from servegraph.render.httproute import RouteError, RouteOptions, render_httproute, serve_service
from servegraph.render.rayservice import rayservice_name
from servegraph.render.upgrade import project

log = logging.getLogger("servegraph.operator")

NO_GATEWAY_API = "is the Gateway API (its HTTPRoute CRD) installed? The operator sees it from its next start"


@dataclass(frozen=True)
class RouteRecord:
    """What the expose step needs of a live HTTPRoute."""

    uid: str
    resource_version: str
    owner_uid: str | None
    """The uid of the ServeGraph controlling it (None: no ServeGraph does)."""
    spec_hash: str
    spec: Mapping[str, Any]
    refused: str | None = None
    """Why a Gateway refused it (its `Accepted` False in the route's status), for the spec it has."""


def record(body: Mapping[str, Any]) -> RouteRecord:
    meta = body.get("metadata") or {}
    owner = next(
        (str(o.get("uid")) for o in meta.get("ownerReferences") or () if o.get("controller") and o.get("kind") == KIND),
        None,
    )
    return RouteRecord(
        uid=str(meta.get("uid", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        owner_uid=owner,
        spec_hash=str((meta.get("annotations") or {}).get(SPEC_HASH_ANNOTATION, "")),
        spec=dict(body.get("spec") or {}),
        refused=_refused(body),
    )


def _refused(body: Mapping[str, Any]) -> str | None:
    generation = (body.get("metadata") or {}).get("generation")
    for parent in (body.get("status") or {}).get("parents") or ():
        ref = parent.get("parentRef") or {}
        for c in parent.get("conditions") or ():
            current = c.get("observedGeneration") in (None, generation)
            if c.get("type") == "Accepted" and c.get("status") == "False" and current:
                where = f"{ref.get('namespace', '')}/{ref.get('name', '')}".strip("/")
                return f"Gateway {where} did not accept it: {c.get('reason', '')}: {str(c.get('message', ''))[:512]}"
    return None


class RouteWriter:
    """Renders, compares, applies and deletes the ServeGraphs' HTTPRoutes; remembers what the
    watch delivered of them (`seen`)."""

    def __init__(self, api: RouteApi | None, metrics: Metrics) -> None:
        self.api = api
        self.metrics = metrics
        self.records: dict[Key, RouteRecord | None] = {}
        """What the watch delivered or a write answered; None: deleted. Missing: not known."""

    def seen(self, body: Mapping[str, Any], deleted: bool = False) -> Key | None:
        """An HTTPRoute the watch delivered: recorded; returns its ServeGraph's key to queue."""
        meta = body.get("metadata") or {}
        where = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        if deleted:
            self.records.pop(where, None)
        else:
            self.records[where] = record(body)
        owners = [o for o in meta.get("ownerReferences") or () if o.get("controller") and o.get("kind") == KIND]
        return (where[0], str(owners[0].get("name"))) if owners else None

    async def reconcile(
        self,
        key: Key,
        body: Mapping[str, Any],
        spec: ServeGraphSpec,
        prefixes: Mapping[str, str],
        may_write: Callable[[], bool],
    ) -> Outcome:
        """The ServeGraph's HTTPRoute as its spec asks: applied, left, or deleted; `prefixes`
        are the running graph's applications and their route prefixes."""
        meta = body["metadata"]
        where = (key[0], key[1])
        uid = str(meta["uid"])
        if spec.expose is None:
            return await self._remove(where, uid, may_write)
        if self.api is None:
            return _failed("ExposeFailed", "spec.expose: this operator was started without HTTPRoute access")
        expose = spec.expose
        rs = rayservice_name(spec.ray_service.name or key[1])
        service, port = serve_service(rs, spec.ray_service.serve_service)
        options = RouteOptions(
            name=key[1],
            namespace=key[0],
            gateway_namespace=expose.gateway_namespace,
            gateway_name=expose.gateway_name,
            section_name=expose.section_name,
            service=service,
            port=port,
            hostnames=expose.hostnames,
            paths=expose.paths,
            labels={"servegraph.io/graph": key[1]},
            owner_references=(owner_reference(body),),
        )
        try:
            desired = render_httproute(prefixes, options)
        except RouteError as exc:
            return Outcome(applied=Condition(ConditionType.APPLIED, False, "ExposeInvalid", str(exc)))
        if where not in self.records:
            try:
                live = await self.api.get_httproute(*where)
            except KubeError as exc:
                return _failed("ExposeFailed", f"{exc}; {NO_GATEWAY_API}" if exc.status == 404 else str(exc))
            self.records[where] = None if live is None else record(live)
        known = self.records[where]
        if known is not None and known.owner_uid != uid:
            return _failed(
                "Conflict",
                f"HTTPRoute {where[0]}/{where[1]} exists and this ServeGraph does not control it; "
                "delete it to let spec.expose create its own",
            )
        if known is not None and _matches(known, desired):
            if known.refused:
                return Outcome(applied=Condition(ConditionType.APPLIED, False, "RouteNotAccepted", known.refused))
            return Outcome()
        if not may_write():
            return Outcome()
        manifest = desired
        if known is not None:
            manifest = {**desired, "metadata": {**desired["metadata"], "resourceVersion": known.resource_version}}
        try:
            written = await self.api.apply_httproute(manifest, force=True)
        except KubeError as exc:
            self.records.pop(where, None)  # read it again next time
            hint = f"; {NO_GATEWAY_API}" if exc.status == 404 else ""
            return _failed("Conflict" if exc.status == 409 else "ExposeFailed", f"{exc}{hint}")
        self.records[where] = record(written)
        self.metrics.writes.labels("httproute").inc()
        verb = "created" if known is None else "updated"
        log.info("[%s/%s] %s HTTPRoute %s", *key, where[1])
        gateway = f"{expose.gateway_namespace}/{expose.gateway_name}"
        said = f"{verb} HTTPRoute {where[1]} on Gateway {gateway} ({', '.join(sorted(prefixes))})"
        return Outcome(events=(Event("Normal", "Exposed", said),))

    async def _remove(self, where: Key, uid: str, may_write: Callable[[], bool]) -> Outcome:
        """No spec.expose: the ServeGraph's route, if the watch delivered one, is deleted."""
        known = self.records.get(where)
        if known is None or known.owner_uid != uid or self.api is None or not may_write():
            return Outcome()
        try:
            await self.api.delete_httproute(*where, known.uid, known.resource_version)
        except KubeError as exc:
            self.records.pop(where, None)
            return _failed("Conflict" if exc.status == 409 else "ExposeFailed", str(exc))
        self.records[where] = None
        self.metrics.writes.labels("httproute").inc()
        log.info("[%s/%s] deleted HTTPRoute (spec.expose removed)", *where)
        return Outcome(events=(Event("Normal", "Unexposed", f"deleted HTTPRoute {where[1]} (spec.expose removed)"),))


def _matches(known: RouteRecord, desired: Mapping[str, Any]) -> bool:
    """The live route is the render: the same hash, and its spec (cut to the keys rendered, so the
    API server's defaults do not count) the rendered one — a hand edit of either is drift."""
    same_spec: bool = project(known.spec, desired["spec"]) == desired["spec"]
    return known.spec_hash == desired["metadata"]["annotations"][SPEC_HASH_ANNOTATION] and same_spec


def _failed(reason: str, message: str) -> Outcome:
    return Outcome(applied=Condition(ConditionType.APPLIED, False, reason, message), retry=True)
