"""Secret references, parsed in one place and resolved the same way wherever they come from.

A ServeGraph names its registry token and CA bundle Secrets (always in its own
namespace, never another); `servegraph run --events-token-secret` names the
events endpoint's token. All of them become a `SecretKeyRef`, and reading the
value out of a Secret's data is done here too, so every error names the Secret
and key the same way and none ever carries the value.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from servegraph.names import Key


class SecretError(Exception):
    """A referenced Secret cannot give its value; `reason` is a CamelCase word for conditions."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class SecretKeyRef:
    """One key of one Secret."""

    namespace: str
    name: str
    key: str

    @property
    def secret(self) -> Key:
        """(namespace, name): what the Secret cache is keyed by."""
        return self.namespace, self.name


def from_spec(raw: Mapping[str, Any] | None, namespace: str, default_key: str) -> SecretKeyRef | None:
    """A `{name, key}` reference of a ServeGraph spec; the namespace is the ServeGraph's own."""
    if not raw:
        return None
    return SecretKeyRef(namespace=namespace, name=str(raw["name"]), key=str(raw.get("key") or default_key))


def from_flag(text: str, key: str) -> SecretKeyRef | None:
    """`NAMESPACE/NAME` as a command-line flag gives it; None when it is not of that form."""
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name:
        return None
    return SecretKeyRef(namespace=namespace, name=name, key=key)


def value(ref: SecretKeyRef, data: Mapping[str, str]) -> str:
    """The (base64) data's value for the key, as text; errors name the Secret and key, never the value."""
    where = f"Secret {ref.namespace}/{ref.name}"
    if ref.key not in data:
        raise SecretError("KeyNotFound", f"{where} has no key {ref.key!r}")
    try:
        return base64.b64decode(data[ref.key]).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        raise SecretError("InvalidValue", f"{where} key {ref.key!r} is not UTF-8 text") from None


Reader = Callable[[str, str], Awaitable[Mapping[str, str]]]
"""Reads a Secret's data from the API server: `KubeClient.read_secret_data`."""


class SecretCache:
    """Secrets read on demand, kept for `ttl_s`: the operator never lists or watches Secrets.

    Why not a watch: RBAC cannot narrow list/watch to the Secrets ServeGraphs name, so a
    watch needs every Secret of the cluster streamed into memory. A `get` per download,
    remembered briefly, needs only `get`, and holds only what a download just used.

    A rotated Secret is read at the next download once its copy is `ttl_s` old; a
    download the registry refuses with 401/403 drops the copy and reads it again at
    once (`invalidate`), so a rotation that revokes the old token costs one request.
    """

    def __init__(self, read: Reader, ttl_s: float = 10.0, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self.ttl_s = ttl_s
        self._monotonic = monotonic
        self._data: dict[Key, tuple[float, dict[str, str]]] = {}

    async def get(self, namespace: str, name: str) -> tuple[dict[str, str], bool]:
        """The Secret's data, and whether it was just read (False: from the cache)."""
        now = self._monotonic()
        kept = self._data.get((namespace, name))
        if kept is not None and now - kept[0] < self.ttl_s:
            return kept[1], False
        data = dict(await self._read(namespace, name))
        self._prune(now)
        self._data[(namespace, name)] = (now, data)
        return data, True

    async def value(self, ref: SecretKeyRef) -> tuple[str, bool]:
        data, fresh = await self.get(ref.namespace, ref.name)
        return value(ref, data), fresh

    def invalidate(self, namespace: str, name: str) -> None:
        self._data.pop((namespace, name), None)

    def __len__(self) -> int:
        return len(self._data)

    def _prune(self, now: float) -> None:
        """Expired copies go whenever a new one is kept: the cache never outgrows one TTL of reads."""
        for key in [k for k, (at, _) in self._data.items() if now - at >= self.ttl_s]:
            del self._data[key]
