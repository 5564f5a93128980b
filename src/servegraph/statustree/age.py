"""How long ago, the way kubectl's AGE column says it (pure)."""

from __future__ import annotations

from datetime import datetime


def age(timestamp: str | None, now: datetime) -> str:
    """`3m`, `2h`, like kubectl's AGE; `?` for a missing or unreadable time."""
    if not timestamp:
        return "?"
    try:
        then = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "?"
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * 2 or (unit == "m" and seconds >= size):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
