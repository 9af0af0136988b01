"""The Redis URLs: ``redis://`` (and ``rediss://``, ``unix://``), ``redis-sentinel://``
and ``redis-cluster://``, parsed into what a shard provider needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = [
    "CLUSTER_SCHEMES",
    "SENTINEL_SCHEMES",
    "ClusterURL",
    "SentinelURL",
    "cluster_safe_url",
    "parse_cluster_url",
    "parse_hosts",
    "parse_sentinel_url",
    "safe_url",
]

SENTINEL_SCHEMES = ("redis-sentinel", "rediss-sentinel")
CLUSTER_SCHEMES = ("redis-cluster", "rediss-cluster")


def safe_url(url: str) -> str:
    """``url`` without credentials, for logs and errors."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<invalid redis url>"
    return f"{parts.scheme}://{host}{port}{parts.path}"


def parse_hosts(
    netloc: str, noun: str
) -> tuple[str | None, str | None, tuple[tuple[str, int], ...]]:
    """``[user:password@]host:port,host:port`` of a multi-host URL (Sentinels, cluster
    seeds): the unquoted username and password, and the addresses.

    Raises:
        ValueError: an address that is not ``host:port`` (``noun`` names them).
    """
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None
    addresses = []
    for address in hosts.split(","):
        host, colon, port = address.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{noun} must be host:port, got {address[:60]!r}")
        addresses.append((host.strip("[]"), int(port)))
    return username, password, tuple(addresses)


# -- the pub/sub reader -----------------------------------------------------------------


@dataclass(frozen=True)
class SentinelURL:
    """A parsed ``redis-sentinel://`` URL."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False


def parse_sentinel_url(url: str) -> SentinelURL:
    """Parse ``redis-sentinel://[user:password@]host:port,host:port/<service>/<db>``.

    Raises:
        ValueError: naming what is wrong (scheme, a Sentinel address, service, db).
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SENTINEL_SCHEMES:
        raise ValueError(f"not a redis-sentinel:// or rediss-sentinel:// URL: {url[:60]!r}")
    netloc, _, path = rest.partition("/")
    parts = path.split("?", 1)[0].strip("/").split("/")
    if not parts[0] or len(parts) > 2:
        raise ValueError(f"the path must be /<service>/<db>, got {path[:60]!r}")
    db = parts[1] if len(parts) == 2 else "0"
    if not db.isdigit():
        raise ValueError(f"the database must be a number, got {db[:20]!r}")
    username, password, sentinels = parse_hosts(netloc, "Sentinels")
    tls = scheme == "rediss-sentinel"
    return SentinelURL(sentinels, unquote(parts[0]), int(db), username, password, tls)


@dataclass(frozen=True)
class ClusterURL:
    """A parsed ``redis-cluster://`` URL."""

    seeds: tuple[tuple[str, int], ...]
    username: str | None = None
    password: str | None = None
    tls: bool = False
    options: dict[str, Any] = field(default_factory=dict)


def cluster_safe_url(url: str) -> str:
    """``url`` (a cluster's or Sentinels', several hosts) without credentials or a query
    (which may hold a ``password=``), for logs and errors."""
    scheme, _, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    return f"{scheme}://{netloc.rpartition('@')[2]}{slash}{path.split('?', 1)[0]}"


def parse_cluster_url(url: str) -> ClusterURL:
    """Parse ``redis-cluster://[user:password@]host:port,host:port/``.

    Raises:
        ValueError: naming what is wrong (scheme, a seed, a path).
    """
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in CLUSTER_SCHEMES:
        raise ValueError(f"not a redis-cluster:// or rediss-cluster:// URL: {url[:60]!r}")
    netloc, _, path = rest.partition("/")
    path = path.split("?", 1)[0]
    if path not in ("", "0"):
        raise ValueError(f"Redis Cluster has only database 0, got path {path!r}")
    username, password, seeds = parse_hosts(netloc, "seed nodes")
    return ClusterURL(seeds, username, password, scheme == "rediss-cluster")
