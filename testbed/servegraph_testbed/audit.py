"""The API server's audit log: which identity sent which request, straight from the server.

Counting an operator's writes from the audit log measures what really reached the API
server (retries, conflicts and all), not what the client believes it sent.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# One event per request, at ResponseComplete, with metadata only (no bodies): enough to
# count requests by user and verb, cheap enough to leave on for a whole session.
DEFAULT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
"""

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})

AuditEvent = dict[str, Any]


class AuditLogRotated(RuntimeError):
    """The log lost what was logged since a mark: counting from it would count too few."""


@dataclass(frozen=True)
class AuditLog:
    """The JSON-lines audit log kube-apiserver writes (appended to across restarts)."""

    path: Path

    def offset(self) -> int:
        """A mark for `events(since=...)`: only events logged after this call count."""
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def events(
        self,
        *,
        user: str | None = None,
        verbs: Collection[str] | None = None,
        resource: str | None = None,
        namespace: str | None = None,
        since: int = 0,
    ) -> list[AuditEvent]:
        """Completed requests matching every given filter, oldest first.

        `user` is the authenticated user name (e.g. "servegraph-operator"), `verbs` the
        Kubernetes verbs (see WRITE_VERBS), `resource` e.g. "rayservices". A log shorter
        than the mark was rotated or truncated since: an error, never an empty count.
        """
        try:
            with self.path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                if since > size:
                    raise AuditLogRotated(
                        f"{self.path} holds {size} bytes, fewer than the mark at {since}: it was "
                        "rotated or truncated, so the requests since the mark cannot be counted"
                    )
                f.seek(since)
                lines = f.read().decode("utf-8", "replace").splitlines()
        except FileNotFoundError:
            if since:
                raise AuditLogRotated(f"{self.path} is gone since the mark at {since}") from None
            return []
        found = []
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:  # a line still being written
                continue
            if event.get("stage") != "ResponseComplete":
                continue
            ref = event.get("objectRef") or {}
            if user is not None and event.get("user", {}).get("username") != user:
                continue
            if verbs is not None and event.get("verb") not in verbs:
                continue
            if resource is not None and ref.get("resource") != resource:
                continue
            if namespace is not None and ref.get("namespace") != namespace:
                continue
            found.append(event)
        return found
