"""Backends, chosen by URL scheme and imported lazily."""

from __future__ import annotations

from broadcaster.backends.base import (
    Backend,
    BackendUnavailable,
    HistoryResult,
    PresenceMember,
)

__all__ = [
    "Backend",
    "BackendUnavailable",
    "HistoryResult",
    "PresenceMember",
    "create_backend",
    "describe_backend",
]


def create_backend(url: str, **options: object) -> Backend:
    """The backend for ``url``: ``memory://``, ``redis://host:port/db``,
    ``redis-cluster://host:port,host:port/`` (Redis Cluster, sharded pub/sub) or
    ``redis-sentinel://host:port,host:port/<service>/<db>`` (the primary Sentinel names);
    ``rediss``-prefixed schemes for TLS.

    Options understood by every backend: ``history_size`` (publications kept per
    channel), ``history_ttl`` (seconds the history lives after the channel's last
    publication), ``history_meta_ttl`` (seconds the epoch and offset live), ``node_id``
    and ``apps`` (the app ids whose control messages this node receives). The Redis
    backend takes more (``prefix``, ``node_ttl``, timeouts...): see
    :class:`broadcaster.backends.redis.RedisBackend`.

    Raises:
        ValueError: for an unsupported scheme or an invalid option.
    """
    scheme = url.split("://", 1)[0]
    if scheme == "memory":
        from broadcaster.backends.memory import MemoryBackend

        return MemoryBackend(**options)  # type: ignore[arg-type]
    if scheme in ("redis", "rediss", "redis-sentinel", "rediss-sentinel"):
        from broadcaster.backends.redis.backend import RedisBackend

        return RedisBackend(url, **options)  # type: ignore[arg-type]
    if scheme in ("redis-cluster", "rediss-cluster"):
        from broadcaster.backends.redis.cluster import RedisClusterBackend

        return RedisClusterBackend(url, **options)
    raise ValueError(
        f"unsupported backend URL {url[:60]!r}: use memory://, redis://host:port/db, "
        "redis-cluster://host:port,host:port/ or redis-sentinel://host:port,host:port/service/db"
    )


_KINDS = {
    "redis": "redis",
    "rediss": "redis (TLS)",
    "redis-sentinel": "sentinel",
    "rediss-sentinel": "sentinel (TLS)",
    "redis-cluster": "cluster",
    "rediss-cluster": "cluster (TLS)",
}


def describe_backend(url: str) -> str:
    """Which backend ``url`` names, for the start-up banner: ``memory (...)``, or
    ``redis`` / ``sentinel`` / ``cluster`` and the URL without its credentials."""
    scheme = url.split("://", 1)[0]
    if scheme == "memory":
        return "memory (this process only: nothing shared with other nodes or workers)"
    from broadcaster.backends.clients import display_url

    return f"{_KINDS.get(scheme, scheme)} {display_url(url)}"
