"""A Redis client for a backend URL, for processes that use Redis without running a node
(the run queue of the demo's web process, ``agent-worker``)."""

from __future__ import annotations

from typing import TypeAlias

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

__all__ = ["RedisClient", "display_url", "redis_client"]

RedisClient: TypeAlias = Redis | RedisCluster
"""A client of a standalone Redis, of the primary Sentinel names, or of a Redis Cluster
(commands are routed to the slot of their keys)."""


def redis_client(url: str, *, timeout: float = 5.0) -> RedisClient:
    """A client for ``redis://``/``rediss://``, ``redis-sentinel://`` (the primary
    Sentinel names, followed through a failover) or ``redis-cluster://`` (seed nodes;
    the slot map is discovered and followed).

    Raises:
        ValueError: for an unknown scheme or an invalid URL.
    """
    scheme = url.split("://", 1)[0]
    if scheme in ("redis", "rediss", "unix"):
        return Redis.from_url(url, socket_connect_timeout=timeout, socket_timeout=timeout)
    if scheme in ("redis-sentinel", "rediss-sentinel"):
        from broadcaster.backends.redis.clients import sentinel_client

        return sentinel_client(url, timeout=timeout, connect_timeout=timeout)
    if scheme in ("redis-cluster", "rediss-cluster"):
        from broadcaster.backends.redis.clients import cluster_client

        return cluster_client(url, timeout=timeout, connect_timeout=timeout)
    raise ValueError(f"not a Redis URL: {url[:60]!r}")


def display_url(url: str) -> str:
    """``url`` without credentials, for logs (any of the schemes above)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return "<invalid redis url>"
    netloc, slash, path = rest.partition("/")
    return f"{scheme}://{netloc.rpartition('@')[2]}{slash}{path.split('?', 1)[0]}"
