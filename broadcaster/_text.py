"""Showing client input in error messages: a short excerpt, never all of it."""

from __future__ import annotations

__all__ = ["EXCERPT_LENGTH", "excerpt"]

EXCERPT_LENGTH = 100
"""Characters of client input an error message may quote."""


def excerpt(value: object, limit: int = EXCERPT_LENGTH) -> str:
    """``repr`` of ``value`` (``str()`` of it), cut to ``limit`` characters with its
    full length noted.

    >>> excerpt("abc")
    "'abc'"
    >>> excerpt("x" * 5000, 4)
    "'xxxx'... (5000 characters)"
    """
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"
