"""kopf's private internals, touched here and nowhere else.

kopf has no public way to do four things the operator relies on: read which change handlers
are registered (`kopf_settings.refuse_change_handlers`, which keeps NoDiffBase safe), choose
the decoder of watch events (`kopf_settings.decode_watch_events_with_orjson`), learn when a
watch's list begins and ends and what it returned (`observe_listings`: after a watch gap,
410 Gone, kopf lists again and delivers no DELETED for what went meanwhile), and the echo
filter leans on how kopf treats a BOOKMARK event: it keeps the resource version and hands
the event to no handler (`echoes.py`). Each is proven on kopf `PROVEN`; pyproject.toml bounds
kopf to that minor release, and `check` (run by tests/unit/test_kopf_private.py, on the floor
too) fails naming the installed version when a release moves any of them.
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
from collections.abc import Callable
from types import ModuleType
from typing import Any

import kopf

PROVEN = "1.45"
"""The kopf minor release these internals were read from and tested on (1.45.0 to 1.45.2)."""


class KopfChanged(RuntimeError):
    """The installed kopf no longer has an internal the operator relies on."""


def changed(what: str) -> KopfChanged:
    """The error for a moved internal, naming the installed kopf and the proven one."""
    return KopfChanged(
        f"kopf {importlib.metadata.version('kopf')} {what}; servegraph relies on it as in kopf {PROVEN} (operator/run/kopf_private.py)"
    )


def _handler_ids(registry: kopf.OperatorRegistry, attribute: str) -> list[str]:
    get_all = getattr(getattr(registry, attribute, None), "get_all_handlers", None)
    if get_all is None:
        raise changed(f"has no OperatorRegistry.{attribute}.get_all_handlers()")
    return sorted(str(h.id) for h in get_all())


def changing_handlers(registry: kopf.OperatorRegistry) -> list[str]:
    """Ids of the on.create/on.update/on.delete/on.resume/on.field handlers: kopf keeps them
    in one registry of "changing" handlers and has no public accessor for it."""
    return _handler_ids(registry, "_changing")


def watching_handlers(registry: kopf.OperatorRegistry) -> list[str]:
    """Ids of the on.event handlers."""
    return _handler_ids(registry, "_watching")


def _api() -> ModuleType:
    """kopf's API client module, which decodes every watch line with its module-level `json`."""
    from kopf._cogs.clients import api

    return api


def install_watch_decoder(decoder: Any) -> bool:
    """Have kopf decode each watch line with `decoder.loads`, by replacing the `json` name of
    its API module, which it uses for nothing else. True once installed (again: a no-op);
    False, and nothing replaced, when that name is no longer the standard library's json."""
    api = _api()
    current = getattr(api, "json", None)
    if current is decoder:
        return True
    if current is not json:
        return False
    setattr(api, "json", decoder)  # noqa: B010 - a private name mypy would refuse
    return True


def watch_loads() -> Callable[[str], Any]:
    """What kopf decodes a watch line with now: tests feed it lines as the watch would."""
    loads: Callable[[str], Any] = _api().json.loads
    return loads


ListStarted = Callable[[str, str, "str | None"], int]
"""(group, plural, namespace or None for all) → a mark the end of that list is given back."""
ListEnded = Callable[[str, str, "str | None", frozenset[tuple[str, str]], int], None]
"""(group, plural, namespace, the (namespace, name) of every object listed, the start's mark)."""

_original_fetch_objs: Any = None


def _fetching() -> ModuleType:
    from kopf._cogs.clients import fetching

    return fetching


def observe_listings(started: ListStarted | None, ended: ListEnded | None = None) -> None:
    """Be told when each of kopf's lists begins and, once every chunk was read, what it returned;
    None: as kopf is. kopf's watch calls `fetching.fetch_objs` through its module, which is
    replaced by a generator that yields exactly what kopf's own does."""
    global _original_fetch_objs
    fetching = _fetching()
    if _original_fetch_objs is None:
        _original_fetch_objs = fetching.fetch_objs
    if started is None or ended is None:
        setattr(fetching, "fetch_objs", _original_fetch_objs)  # noqa: B010 - a private name
        return
    original = _original_fetch_objs
    begin, end = started, ended

    async def fetch_objs(*, settings: Any, resource: Any, namespace: Any, logger: Any) -> Any:
        mark = begin(resource.group, resource.plural, namespace)
        listed: set[tuple[str, str]] = set()
        async for items, version in original(settings=settings, resource=resource, namespace=namespace, logger=logger):
            for item in items:
                meta = item.get("metadata") or {}
                listed.add((str(meta.get("namespace", "")), str(meta.get("name", ""))))
            yield items, version
        end(resource.group, resource.plural, namespace, frozenset(listed), mark)

    setattr(fetching, "fetch_objs", fetch_objs)  # noqa: B010 - a private name


def check() -> None:
    """KopfChanged, naming the installed version, for the first internal that is not as proven."""
    try:
        api = _api()
    except ImportError as e:
        raise changed(f"has no module kopf._cogs.clients.api ({e})") from e
    if not hasattr(getattr(api, "json", None), "loads"):
        raise changed("has no `json` in kopf._cogs.clients.api to decode watch events with")
    if "json.loads(" not in inspect.getsource(api.stream):
        raise changed("no longer decodes each watch line with `json.loads` in kopf._cogs.clients.api.stream")
    from kopf._core.reactor import queueing

    if "'BOOKMARK'" not in inspect.getsource(queueing.watcher):
        raise changed("no longer drops BOOKMARK events before its handlers (kopf._core.reactor.queueing.watcher)")
    from kopf._cogs.clients import watching

    if "fetching.fetch_objs(" not in inspect.getsource(watching.continuous_watch):
        raise changed("no longer lists through kopf._cogs.clients.fetching.fetch_objs in continuous_watch")
    if list(inspect.signature(_fetching().fetch_objs).parameters) != ["settings", "resource", "namespace", "logger"]:
        raise changed("calls fetching.fetch_objs with other arguments than (settings, resource, namespace, logger)")
    registry = kopf.OperatorRegistry()

    @kopf.on.create("servegraph.io", "v1alpha1", "probes", registry=registry, id="probe-create")
    def created(**_: Any) -> None: ...

    @kopf.on.event("servegraph.io", "v1alpha1", "probes", registry=registry, id="probe-event")
    def watched(**_: Any) -> None: ...

    if changing_handlers(registry) != ["probe-create"] or watching_handlers(registry) != ["probe-event"]:
        raise changed("keeps on.create and on.event handlers elsewhere than OperatorRegistry._changing/_watching")
