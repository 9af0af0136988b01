"""Backends, chosen by URL scheme and imported lazily."""

from __future__ import annotations

from broadcaster.backends.base import (
    Backend,
    BackendUnavailable,
    HistoryResult,
    PresenceMember,
)

__all__ = ["Backend", "BackendUnavailable", "HistoryResult", "PresenceMember", "create_backend"]


def create_backend(url: str, **options: object) -> Backend:
    """The backend for ``url``: ``memory://`` or ``redis://host:port/db``.

    Raises:
        ValueError: for an unsupported scheme.
    """
    scheme = url.split("://", 1)[0]
    if scheme == "memory":
        from broadcaster.backends.memory import MemoryBackend

        return MemoryBackend(**options)  # type: ignore[arg-type]
    if scheme in ("redis", "rediss"):
        from broadcaster.backends.redis import RedisBackend

        return RedisBackend(url, **options)  # type: ignore[arg-type]
    raise ValueError(f"unsupported backend URL {url!r}: use memory:// or redis://host:port/db")
