"""Which ServeGraphs this operator owns when several run side by side (`--shard`).

A ServeGraph names its shard in the `servegraph.io/shard` label. The instance started
with `--shard NAME` owns those labelled NAME; the one started with `--shard-default`
owns those without the label (the main instance); one started with neither owns all
(one operator, no sharding). The watch asks the API server for exactly that set (a
server-side label selector), so a shard lists, streams and caches only its own, and a
relabelled ServeGraph leaves the old shard's watch as a DELETED event and enters the
new one's as ADDED.

The same rule, `owns`, is checked on the latest body before every write, and the status
write carries the label as a JSON-patch precondition: a shard that is mid-reconcile when
its ServeGraph is moved writes nothing the API server accepts after the move.

Whoever edits a ServeGraph sets its label, so a shard is no boundary between tenants by
itself: the pod policy (config/policy, `shardsFollowNamespaces`) holds the label to the
namespace's, which only the administrator sets (docs/install.md#sharding).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from servegraph.names import SHARD_LABEL

# A DNS label (a valid label value too): the shard's name also names its Lease and Deployment.
_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class Shard:
    """`name`: own ServeGraphs labelled with it; None with `default`: own unlabelled ones;
    None without: own every ServeGraph."""

    name: str | None = None
    default: bool = False

    @classmethod
    def from_flags(cls, name: str | None, default: bool) -> Shard:
        """Raises ValueError naming the problem (the caller reports it as a usage error)."""
        if name is not None and default:
            raise ValueError(
                "--shard and --shard-default exclude each other: the default shard owns ServeGraphs "
                f"without the {SHARD_LABEL} label, a named one those labelled with its name"
            )
        if name is not None and not _NAME.fullmatch(name):
            raise ValueError(
                f"--shard {name!r} is not a DNS label (1-63 lowercase letters, digits or '-', starting and "
                "ending with a letter or digit); for ServeGraphs without the label use --shard-default"
            )
        return cls(name, default)

    @property
    def sharded(self) -> bool:
        return self.name is not None or self.default

    def selector(self) -> str:
        """The watch's server-side label selector ("" selects everything)."""
        if self.name is not None:
            return f"{SHARD_LABEL}={self.name}"
        return f"!{SHARD_LABEL}" if self.default else ""

    def owns(self, body: Mapping[str, Any]) -> bool:
        """Whether this shard reconciles the ServeGraph `body` (the selector, client-side)."""
        if not self.sharded:
            return True
        labels = (body.get("metadata") or {}).get("labels") or {}
        if self.name is not None:
            return labels.get(SHARD_LABEL) == self.name
        return SHARD_LABEL not in labels

    def lease_name(self, base: str) -> str:
        """Each shard elects its own leader: a named shard's Lease is `base-shard-NAME`."""
        if self.name is None:
            return base
        return f"{base}-shard-{self.name}"
