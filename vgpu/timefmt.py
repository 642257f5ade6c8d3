"""The project's one RFC 3339 formatter and parser, over epoch seconds.

Every timestamp the project writes (allocations' ``boundAt``, hand-off receipts, Events, conditions,
Leases, usage documents, live-limit files) is UTC with a ``Z``, at the precision its reader expects:
whole seconds for Kubernetes ``Time`` fields, microseconds for ``MicroTime`` (Leases), milliseconds
for the project's own documents. Callers pass the time in; nothing here reads a clock.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

Precision = Literal["seconds", "milliseconds", "microseconds"]


def rfc3339(seconds: float, precision: Precision = "seconds") -> str:
    """``seconds`` since the epoch as RFC 3339 in UTC, e.g. ``2026-11-27T05:14:25Z`` (``.123Z`` in milliseconds)."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec=precision).replace("+00:00", "Z")


def parse_rfc3339(text: str) -> float:
    """Epoch seconds of an RFC 3339 time; ValueError when it is not one or names no time zone."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an RFC 3339 time") from None
    if when.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return when.timestamp()
