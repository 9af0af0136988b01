"""Moved to :mod:`broadcaster.backends.redis.cluster` (this module keeps the old import
path working)."""

from __future__ import annotations

from broadcaster.backends.redis.cluster import (
    SCHEMES,
    ClusterURL,
    RedisClusterBackend,
    cluster_client,
    cluster_safe_url,
    parse_cluster_url,
)
from broadcaster.backends.redis.layout import channel_key
from broadcaster.backends.redis.publish import publish_via_redis_cluster

__all__ = [
    "SCHEMES",
    "ClusterURL",
    "RedisClusterBackend",
    "channel_key",
    "cluster_client",
    "cluster_safe_url",
    "parse_cluster_url",
    "publish_via_redis_cluster",
]
