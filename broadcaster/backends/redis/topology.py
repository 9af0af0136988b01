"""Where the primary is: a standalone Redis (the URL names it) or the primary Redis
Sentinel names. A topology gives the backend its clients and the address its own
connections (pub/sub, publications) open; the backend's code path is the same for both.
(As redis-py, where Sentinel is a connection pool, not another client.) Redis Cluster's
clients come from :class:`ClusterTopology`; its sharded pub/sub opens connections of
its own (:mod:`broadcaster.backends.redis.cluster`).

``redis-sentinel://[user:password@]host:port,host:port/<service>/<db>`` names the
Sentinels, the monitored service and the database (``rediss-sentinel://`` for TLS to
the primary; credentials are the primary's, the Sentinels are asked without). Commands
go through a pool that asks Sentinel for the primary whenever it connects (and drops a
connection that finds a demoted primary); the backend's own connections ask
(:meth:`SentinelTopology.locate`) each time they connect. After a failover the old
primary's connections fail, the node is not ready for as long as no primary answers,
then reconnects to the promoted one. The topology also listens to the Sentinels'
``+switch-master`` (:meth:`SentinelTopology.watch`) and tells the backend at once: after
a manual failover the old primary stays up and writable for about 10 s, and what it
took meanwhile is dropped when it becomes a replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import quote

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import AbstractConnection, Connection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from broadcaster.backends.redis.clients import MAX_CONNECTIONS, cluster_client, sentinel_client
from broadcaster.backends.redis.urls import (
    CLUSTER_SCHEMES,
    SENTINEL_SCHEMES,
    ClusterURL,
    cluster_safe_url,
    parse_cluster_url,
    parse_sentinel_url,
    safe_url,
)

__all__ = ["ClusterTopology", "SentinelTopology", "Standalone", "Topology", "topology_for"]

log = logging.getLogger(__name__)

_ERRORS = (RedisError, OSError)
_POOL_WAIT = 10  # command timeouts a command may wait for a free connection
_SWITCH_POLL = 1.0  # seconds a wait for +switch-master lasts before it checks for a stop

OnSwitch = Callable[[str, int], Awaitable[None]]
"""Told the new primary's host and port when Sentinel names one."""


class Topology(Protocol):
    """Where the backend's primary is, and its clients."""

    url: str
    """The URL without credentials, for logs and errors."""
    locates: bool
    """The primary may move (Sentinel): a ``READONLY`` reply means ask again."""
    client: Redis
    """Commands (a pool)."""
    prober: Redis
    """The readiness probe's own connection."""

    async def locate(self) -> None:
        """Find the primary before the backend's own connections connect."""

    def connection(self, **options: Any) -> AbstractConnection:
        """A new (unconnected) connection to the primary, with ``options``."""

    def at(self, host: str, port: int) -> bool:
        """Whether the backend's connections go to ``host:port`` now."""

    async def watch(self, on_switch: OnSwitch, stopped: Callable[[], bool]) -> None:
        """Tell ``on_switch`` about a new primary as soon as it is named, until
        ``stopped()``; returns at once where the primary never moves."""

    async def close(self) -> None:
        """Close the clients."""


class Standalone:
    """A standalone Redis (or a primary with replicas): ``redis://``, ``rediss://``,
    ``unix://``."""

    locates = False

    def __init__(self, url: str, *, command_timeout: float, connect_timeout: float) -> None:
        self._connect_kwargs = _connect_kwargs(url)
        self.url = safe_url(url)
        self._connect_timeout = connect_timeout
        # A reconnect storm makes thousands of concurrent commands (history reads,
        # presence): they wait for one of the pool's connections instead of failing.
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=MAX_CONNECTIONS,
            timeout=_POOL_WAIT * command_timeout,
            protocol=2,
            socket_timeout=command_timeout,
            socket_connect_timeout=connect_timeout,
            retry=Retry(NoBackoff(), 0),
        )
        self.client = Redis(connection_pool=pool)
        # Its own connection, so that a PING measures Redis, not a busy pool.
        self.prober = Redis.from_url(
            url,
            protocol=2,
            single_connection_client=True,
            socket_timeout=command_timeout,
            socket_connect_timeout=connect_timeout,
            retry=Retry(NoBackoff(), 0),
        )

    async def locate(self) -> None:
        return None

    def connection(self, **options: Any) -> AbstractConnection:
        kwargs = dict(self._connect_kwargs)
        connection_class = kwargs.pop("connection_class", Connection)
        kwargs.update(
            protocol=2,  # RESP2: messages come back as replies, not push handlers
            socket_connect_timeout=self._connect_timeout,
            retry=Retry(NoBackoff(), 0),
        )
        kwargs.update(options)
        connection: AbstractConnection = connection_class(**kwargs)
        return connection

    def at(self, host: str, port: int) -> bool:
        return (self._connect_kwargs.get("host"), self._connect_kwargs.get("port")) == (host, port)

    async def watch(self, on_switch: OnSwitch, stopped: Callable[[], bool]) -> None:
        return None

    async def close(self) -> None:
        with contextlib.suppress(*_ERRORS):
            await self.client.connection_pool.disconnect()
        with contextlib.suppress(*_ERRORS):
            await self.prober.aclose()


class SentinelTopology(Standalone):
    """The primary Redis Sentinel names: ``redis-sentinel://`` (see the module doc)."""

    locates = True

    def __init__(self, url: str, *, command_timeout: float, connect_timeout: float) -> None:
        parsed = parse_sentinel_url(url)
        host, port = parsed.sentinels[0]  # replaced by the primary's address on locate()
        scheme = "rediss" if parsed.tls else "redis"
        auth = ""
        if parsed.username or parsed.password:
            auth = f"{quote(parsed.username or '')}:{quote(parsed.password or '')}@"
        self._connect_kwargs = _connect_kwargs(f"{scheme}://{auth}{host}:{port}/{parsed.db}")
        self._connect_timeout = connect_timeout
        self.url = cluster_safe_url(url)
        self.service = parsed.service
        timeouts = {"timeout": command_timeout, "connect_timeout": connect_timeout}
        self.client = sentinel_client(url, max_connections=MAX_CONNECTIONS, **timeouts)
        self.prober = sentinel_client(url, max_connections=1, **timeouts)
        self._sentinel: Sentinel = self.client.connection_pool.sentinel_manager  # type: ignore[attr-defined]

    async def locate(self) -> None:
        """Ask Sentinel for the primary."""
        host, port = await self._sentinel.discover_master(self.service)
        self._connect_kwargs.update(host=host, port=port)

    async def watch(self, on_switch: OnSwitch, stopped: Callable[[], bool]) -> None:
        """Listen to ``+switch-master`` on one Sentinel after another and tell
        ``on_switch`` about a new primary of the service at once."""
        sentinels = self._sentinel.sentinels
        turn = 0
        while not stopped():
            sentinel = sentinels[turn % len(sentinels)]
            turn += 1
            pubsub = sentinel.pubsub()
            try:
                await pubsub.subscribe("+switch-master")
                # A switch while no Sentinel was listened to: follow it now.
                address = await sentinel.sentinel_get_master_addr_by_name(
                    self.service, return_responses=True
                )
                if isinstance(address, tuple | list) and len(address) == 2:
                    host = address[0].decode() if isinstance(address[0], bytes) else address[0]
                    await on_switch(str(host), int(address[1]))
                while not stopped():
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=_SWITCH_POLL
                    )
                    if message is not None:
                        await self._switched(message["data"], on_switch)
            except _ERRORS as exc:
                log.debug("Sentinel %s: not listening to +switch-master (%s)", sentinel, exc)
                await asyncio.sleep(_SWITCH_POLL)
            finally:
                with contextlib.suppress(*_ERRORS):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def _switched(self, data: bytes | str, on_switch: OnSwitch) -> None:
        """``<service> <old ip> <old port> <new ip> <new port>``: this service's?"""
        text = data.decode() if isinstance(data, bytes) else data
        fields = text.split()
        if len(fields) == 5 and fields[0] == self.service and fields[4].isdigit():
            await on_switch(fields[3], int(fields[4]))

    async def close(self) -> None:
        for client in (self.client, self.prober):
            with contextlib.suppress(*_ERRORS):
                await client.aclose()


class ClusterTopology:
    """Redis Cluster: ``redis-cluster://`` seed nodes. Its clients route each command to
    the slot's primary and follow the slot map; the backend's sharded pub/sub connects
    to each primary itself (:mod:`broadcaster.backends.redis.cluster`)."""

    locates = False

    def __init__(self, url: str, *, command_timeout: float, connect_timeout: float) -> None:
        self.parsed: ClusterURL = parse_cluster_url(url)
        self.url = cluster_safe_url(url)
        timeouts = {"timeout": command_timeout, "connect_timeout": connect_timeout}
        # Typed as the other topologies' clients: the backend's commands are the same
        # (the cluster client routes them); what is Cluster-only goes through
        # RedisClusterBackend.cluster.
        self.client: Redis = cluster_client(url, **timeouts)  # type: ignore[assignment]
        self.prober: Redis = cluster_client(url, **timeouts)  # type: ignore[assignment]

    async def locate(self) -> None:
        return None

    def connection(self, **options: Any) -> AbstractConnection:
        raise NotImplementedError("Redis Cluster's pub/sub connects to each shard itself")

    def at(self, host: str, port: int) -> bool:
        return False

    async def watch(self, on_switch: OnSwitch, stopped: Callable[[], bool]) -> None:
        return None

    async def close(self) -> None:
        for client in (self.client, self.prober):
            with contextlib.suppress(*_ERRORS):
                await client.aclose()


def _connect_kwargs(url: str) -> dict[str, Any]:
    try:
        return dict(parse_url(url))
    except ValueError as exc:
        raise ValueError(f"invalid Redis URL {safe_url(url)!r}: {exc}") from None


def topology_for(url: str, *, command_timeout: float, connect_timeout: float) -> Topology:
    """The topology of a ``redis://`` (``rediss://``, ``unix://``),
    ``redis-sentinel://`` or ``redis-cluster://`` URL.

    Raises:
        ValueError: for an invalid URL.
    """
    timeouts = {"command_timeout": command_timeout, "connect_timeout": connect_timeout}
    scheme = url.partition("://")[0]
    if scheme in SENTINEL_SCHEMES:
        return SentinelTopology(url, **timeouts)
    if scheme in CLUSTER_SCHEMES:
        return ClusterTopology(url, **timeouts)
    return Standalone(url, **timeouts)
