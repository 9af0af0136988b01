"""Showing client input in error messages: a short excerpt, never all of it."""

from __future__ import annotations

__all__ = ["excerpt"]

EXCERPT_LENGTH = 40


def excerpt(value: str, limit: int = EXCERPT_LENGTH) -> str:
    """``repr`` of ``value``, cut to ``limit`` characters with its full length noted.

    >>> excerpt("abc")
    "'abc'"
    >>> excerpt("x" * 5000, 4)
    "'xxxx'... (5000 characters)"
    """
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"
