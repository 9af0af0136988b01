"""Redis Sentinel: the Redis backend on the primary Sentinel names.

Not another backend: :class:`~broadcaster.backends.redis.backend.RedisBackend` takes a
``redis-sentinel://`` URL and finds its primary through
:class:`~broadcaster.backends.redis.topology.SentinelTopology` (as redis-py, where
Sentinel is a connection pool). This module keeps the names earlier versions exported.
"""

from __future__ import annotations

from broadcaster.backends.redis.backend import RedisBackend
from broadcaster.backends.redis.clients import sentinel_client
from broadcaster.backends.redis.urls import SENTINEL_SCHEMES, SentinelURL, parse_sentinel_url

__all__ = [
    "SCHEMES",
    "RedisSentinelBackend",
    "SentinelURL",
    "parse_sentinel_url",
    "sentinel_client",
]

SCHEMES = SENTINEL_SCHEMES

RedisSentinelBackend = RedisBackend
"""The Redis backend, given a ``redis-sentinel://`` URL."""
