"""Clients of the three topologies, as the backend and the processes that publish
without a node (agents, workers) use them: a client of the primary Sentinel names (a
redis-py client whose connection pool asks Sentinel), and a Redis Cluster client."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff, NoBackoff

from broadcaster.backends.redis.urls import parse_cluster_url, parse_sentinel_url

__all__ = ["MAX_CONNECTIONS", "cluster_client", "sentinel_client"]

MAX_CONNECTIONS = 100
"""Connections to Redis a client pools (besides a node's pub/sub connections)."""


def sentinel_client(
    url: str, *, timeout: float = 2.0, connect_timeout: float = 2.0, max_connections: int = 0
) -> Redis:
    """A client of the primary that Sentinel names for ``url`` (``redis-sentinel://``),
    as the backend and the processes that publish without a node (agents, workers) use.

    Raises:
        ValueError: for an invalid URL.
    """
    parsed = parse_sentinel_url(url)
    options: dict[str, Any] = {
        "db": parsed.db,
        "username": parsed.username,
        "password": parsed.password,
        "protocol": 2,
        "socket_timeout": timeout,
        "socket_connect_timeout": connect_timeout,
        "retry": Retry(NoBackoff(), 0),
    }
    if parsed.tls:
        options["ssl"] = True
    if max_connections:
        options["max_connections"] = max_connections
    # No retries with back-off on a Sentinel: one that is down must fail at once so that
    # the next one is asked (redis-py's default retries would spend seconds on it, longer
    # than a readiness PING may take, and the node would stay not ready).
    sentinel_options = {
        "socket_timeout": timeout,
        "socket_connect_timeout": connect_timeout,
        "retry": Retry(NoBackoff(), 0),
    }
    sentinel = Sentinel(list(parsed.sentinels), sentinel_kwargs=sentinel_options, **options)  # type: ignore[no-untyped-call]
    client: Redis = sentinel.master_for(parsed.service, redis_class=_SentinelRedis)
    return client


class _SentinelRedis(Redis):
    """A client of the primary whose ``aclose`` closes its Sentinel connections too."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        for sentinel in self.connection_pool.sentinel_manager.sentinels:  # type: ignore[attr-defined]
            await sentinel.aclose()


def cluster_client(url: str, *, timeout: float = 2.0, connect_timeout: float = 2.0) -> RedisCluster:
    """A ``RedisCluster`` client for ``url`` (``redis-cluster://...``), as the backend and
    the processes that publish without a node (agents, workers) use it.

    Raises:
        ValueError: for an invalid URL.
    """
    parsed = parse_cluster_url(url)
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in parsed.seeds],
        username=parsed.username,
        password=parsed.password,
        ssl=parsed.tls,
        protocol=2,
        max_connections=MAX_CONNECTIONS,
        socket_timeout=timeout,
        socket_connect_timeout=connect_timeout,
        retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), 3),
    )
