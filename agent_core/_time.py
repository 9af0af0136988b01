"""Time helpers: an injectable clock and ISO-8601 conversion (always UTC)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

__all__ = ["Clock", "elapsed_ms", "elapsed_seconds", "from_iso", "to_iso", "utc_now"]

Clock = Callable[[], datetime]
"""Returns the current time as an aware UTC datetime; injected so tests are exact."""


def utc_now() -> datetime:
    """The real clock."""
    return datetime.now(UTC)


def to_iso(moment: datetime) -> str:
    """Full-precision ISO-8601 text of an aware datetime."""
    return moment.isoformat()


def from_iso(text: str) -> datetime:
    """Parse ISO-8601 text (a trailing ``Z`` means UTC); naive times are taken as UTC.

    Raises:
        ValueError: ``text`` is not an ISO-8601 timestamp.
    """
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def elapsed_seconds(start: datetime, end: datetime) -> float:
    """Seconds from ``start`` to ``end`` (never negative: clocks may step back)."""
    return max(0.0, (end - start).total_seconds())


def elapsed_ms(start: datetime, end: datetime) -> float:
    """Milliseconds from ``start`` to ``end`` (never negative)."""
    return elapsed_seconds(start, end) * 1000.0
