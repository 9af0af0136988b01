"""Moved to :mod:`broadcaster.backends.redis.sentinel` (this module keeps the old
import path working)."""

from __future__ import annotations

from broadcaster.backends.redis.sentinel import (
    SCHEMES,
    RedisSentinelBackend,
    SentinelURL,
    parse_sentinel_url,
    sentinel_client,
)

__all__ = [
    "SCHEMES",
    "RedisSentinelBackend",
    "SentinelURL",
    "parse_sentinel_url",
    "sentinel_client",
]
