"""The Redis Sentinel backend: the Redis backend on the primary that Sentinel names.

URL: ``redis-sentinel://[user:password@]host:port,host:port/<service>/<db>`` (the
Sentinels, the monitored service's name, the database number), or
``rediss-sentinel://`` for TLS to the Redis primary. Credentials are the primary's;
the Sentinels are asked without credentials.

Everything else is the standalone backend (same layout, scripts and hot path): commands
go through a pool that asks Sentinel for the primary whenever it connects (and drops a
connection that finds a demoted primary), and the pub/sub connection asks Sentinel for
the primary each time it connects. After a failover the old primary's connections fail,
the node is not ready for as long as no primary answers, then reconnects to the promoted
one, subscribes again and counts a reconnection (so the hub fills what channels missed).
The node also listens to the Sentinels' ``+switch-master`` and moves every connection to
a new primary as soon as it is named: after a manual failover the old primary stays up
and writable for about 10 s, and what it took meanwhile is dropped when it becomes a
replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff

from broadcaster.backends.base import ControlHandler, EncodedHandler, PublicationHandler
from broadcaster.backends.redis import _ERRORS, _MAX_CONNECTIONS, RedisBackend, parse_hosts

__all__ = ["RedisSentinelBackend", "SentinelURL", "parse_sentinel_url", "sentinel_client"]

log = logging.getLogger(__name__)

_SWITCH_POLL = 1.0  # seconds a wait for +switch-master lasts before it checks for a stop

SCHEMES = ("redis-sentinel", "rediss-sentinel")


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
    if not sep or scheme not in SCHEMES:
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


class RedisSentinelBackend(RedisBackend):
    """The Redis backend on the primary Sentinel names (see the module's docstring);
    same options as :class:`~broadcaster.backends.redis.RedisBackend`.

    Raises:
        ValueError: for an invalid URL or option, naming it.
    """

    def __init__(self, url: str, **options: Any) -> None:
        parsed = parse_sentinel_url(url)
        host, port = parsed.sentinels[0]  # replaced by the primary's address on connect
        scheme = "rediss" if parsed.tls else "redis"
        auth = ""
        if parsed.username or parsed.password:
            auth = f"{quote(parsed.username or '')}:{quote(parsed.password or '')}@"
        super().__init__(f"{scheme}://{auth}{host}:{port}/{parsed.db}", **options)
        self.url = f"{url.partition('://')[0]}://{url.partition('://')[2].rpartition('@')[2]}"
        self.service = parsed.service
        timeouts = {"timeout": self.command_timeout, "connect_timeout": self.connect_timeout}
        self._client = sentinel_client(url, max_connections=_MAX_CONNECTIONS, **timeouts)
        self._prober = sentinel_client(url, max_connections=1, **timeouts)
        self._sentinel: Sentinel = self._client.connection_pool.sentinel_manager  # type: ignore[attr-defined]

    async def start(
        self,
        on_publication: PublicationHandler,
        on_control: ControlHandler,
        on_encoded: EncodedHandler | None = None,
    ) -> None:
        """See :meth:`RedisBackend.start`; also follows Sentinel's ``+switch-master``."""
        await super().start(on_publication, on_control, on_encoded)
        if not self._stopped:
            task = asyncio.create_task(self._follow_switches(), name="redis-sentinel-switches")
            self._tasks.append(task)

    async def _follow_switches(self) -> None:
        """Listen to ``+switch-master`` on one Sentinel after another and follow a new
        primary of the service at once. After a manual failover (``SENTINEL FAILOVER``)
        the old primary stays writable until Sentinel turns it into a replica, about
        10 s later, and then drops what was written to it meanwhile: publications
        acknowledged there would be lost from the history."""
        sentinels = self._sentinel.sentinels
        turn = 0
        while not self._stopped:
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
                    await self._follow(str(host), int(address[1]))
                while not self._stopped:
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=_SWITCH_POLL
                    )
                    if message is not None:
                        await self._switched(message["data"])
            except _ERRORS as exc:
                log.debug("Sentinel %s: not listening to +switch-master (%s)", sentinel, exc)
                await asyncio.sleep(_SWITCH_POLL)
            finally:
                with contextlib.suppress(*_ERRORS):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def _switched(self, data: bytes | str) -> None:
        """``<service> <old ip> <old port> <new ip> <new port>``: reconnect every
        connection to the new primary if it is this service's and not where we are."""
        text = data.decode() if isinstance(data, bytes) else data
        fields = text.split()
        if len(fields) == 5 and fields[0] == self.service and fields[4].isdigit():
            await self._follow(fields[3], int(fields[4]))

    async def _follow(self, host: str, port: int) -> None:
        """Move every connection to the primary at ``host:port`` unless already there."""
        if (self._connect_kwargs.get("host"), self._connect_kwargs.get("port")) == (host, port):
            return  # already there (reconnected after the old primary died)
        log.warning("Sentinel made %s:%d the primary of %s; following it", host, port, self.service)
        reader = self._reader
        if reader is not None and not reader.lost.done():
            # Still reading the old primary, which may take other nodes' publications
            # until Sentinel demotes it. (After it died, the loss counted the break.)
            self.breaks += 1
        await self._drop_publisher()
        await self._drop_pubsub()  # the node reconnects, asking Sentinel for the primary
        with contextlib.suppress(*_ERRORS):
            await self._client.connection_pool.disconnect()
        self._retry_now.set()  # a reconnection waiting out its back-off goes now

    async def _connect(self) -> None:
        """Ask Sentinel for the primary, then connect as the standalone backend does."""
        host, port = await self._sentinel.discover_master(self.service)
        self._connect_kwargs.update(host=host, port=port)
        await super()._connect()

    async def _follow_primary(self) -> None:
        """A demoted primary answered ``READONLY``: reconnect through Sentinel (dropping
        the pub/sub connection makes the node reconnect, asking for the primary)."""
        # No break: it read the old primary until it was demoted, and took no writes since.
        await self._drop_publisher()
        await self._drop_pubsub()

    async def _close_clients(self) -> None:
        for client in (self._client, self._prober):
            with contextlib.suppress(*_ERRORS):
                await client.aclose()
