"""A Redis client for a backend URL, for processes that use Redis without running a node
(the run queue of the demo's web process, ``agent-worker``)."""

from __future__ import annotations

from redis.asyncio import Redis

__all__ = ["redis_client"]


def redis_client(url: str, *, timeout: float = 5.0) -> Redis:
    """A client for ``redis://``/``rediss://`` or ``redis-sentinel://`` (the primary
    Sentinel names, followed through a failover).

    Raises:
        ValueError: for a Redis Cluster URL (the run queue's scripts span keys of
            several slots: not supported yet) or an unknown scheme.
    """
    scheme = url.split("://", 1)[0]
    if scheme in ("redis", "rediss", "unix"):
        return Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    if scheme in ("redis-sentinel", "rediss-sentinel"):
        from broadcaster.backends.redis_sentinel import sentinel_client

        return sentinel_client(url, timeout=timeout, connect_timeout=timeout)
    if scheme in ("redis-cluster", "rediss-cluster"):
        raise ValueError(
            "the run queue (agent-worker) does not support Redis Cluster yet: its scripts "
            "span keys of several slots; use redis:// or redis-sentinel://"
        )
    raise ValueError(f"not a Redis URL: {url[:60]!r}")
