"""Redis Cluster: the Redis backend with sharded pub/sub and a pipeline per shard.

:class:`RedisClusterBackend` is composed of the same core, presence, counts, liveness
and admission as :class:`~broadcaster.backends.redis.backend.RedisBackend`, with
:class:`ShardedPubSub` and :class:`ShardBatches` in place of one pub/sub connection and
one publications connection; its clients come from
:class:`~broadcaster.backends.redis.topology.ClusterTopology`.

URL: ``redis-cluster://[user:password@]host:port,host:port/`` (seed nodes; any reachable
one is enough, the rest of the cluster is discovered), or ``rediss-cluster://`` for TLS.

The key layout, the scripts and the state a node keeps in Redis (heartbeat, presence,
counts, admission, claims) are those of every topology
(:mod:`broadcaster.backends.redis.layout`, :mod:`broadcaster.backends.redis.scripts`):
every key of one channel shares a hash tag, and so does its shard channel. What Redis
Cluster changes is pub/sub and the publications' round trips:

Each node opens one pub/sub connection per primary that owns a slot of a channel its
clients use (never to the others), ``SSUBSCRIBE``\\ s there, and follows the cluster:
when a shard's connection fails, or Redis unsubscribes a channel because its slot moved,
the node refreshes the slot map and subscribes again on the slot's owner, then counts a
reconnection so the hub fills what the channels missed from their history. A subscribe
that arrives meanwhile returns once a pass of that resync has subscribed it (or fails
after ``command_timeout``: the client is closed with 4100 and comes back), never before
it is in effect; an unsubscribe that arrives meanwhile is carried out when the pass ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, ClassVar

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import AbstractConnection, Connection, SSLConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import NoScriptError, RedisClusterException
from redis.exceptions import TimeoutError as RedisTimeoutError

from broadcaster.backends.base import NotReplicated
from broadcaster.backends.redis import scripts
from broadcaster.backends.redis.batching import Outbox
from broadcaster.backends.redis.clients import cluster_client
from broadcaster.backends.redis.codec import encode_publication, publish_result
from broadcaster.backends.redis.core import ERRORS, PendingPublication
from broadcaster.backends.redis.layout import publication_channel
from broadcaster.backends.redis.liveness import Liveness
from broadcaster.backends.redis.presence import PresenceAndCounts
from broadcaster.backends.redis.publish import Call, publish_and_wait, publish_script_args
from broadcaster.backends.redis.pubsub import PubSubBase
from broadcaster.backends.redis.resp import PubSubReader, take_over
from broadcaster.backends.redis.topology import ClusterTopology
from broadcaster.backends.redis.urls import (
    CLUSTER_SCHEMES,
    ClusterURL,
    cluster_safe_url,
    parse_cluster_url,
)

__all__ = [
    "SCHEMES",
    "ClusterURL",
    "RedisClusterBackend",
    "ShardBatches",
    "ShardedPubSub",
    "cluster_client",
    "cluster_safe_url",
    "parse_cluster_url",
]

log = logging.getLogger(__name__)

SCHEMES = CLUSTER_SCHEMES
_ERRORS = ERRORS


@dataclass
class _Shard:
    """One pub/sub connection to a primary, read by a :class:`PubSubReader`, and the
    shard channels subscribed there."""

    address: tuple[str, int]
    conn: AbstractConnection
    channels: set[bytes] = field(default_factory=set)
    reader: PubSubReader | None = None
    watch: asyncio.Task[None] | None = None  # handles the loss of the connection
    pong_at: float = 0.0

    @property
    def alive(self) -> bool:
        """Connected, and its reader has not lost the connection."""
        reader = self.reader
        return reader is not None and not reader.lost.done() and self.conn.is_connected


class ShardedPubSub(PubSubBase):
    """Sharded pub/sub: one connection per primary that owns a slot of a channel this
    node's clients use, followed through slot moves and failovers (see the module
    doc)."""

    _SUBSCRIBE: ClassVar[bytes] = b"ssubscribe"
    _UNSUBSCRIBE: ClassVar[bytes] = b"sunsubscribe"
    _sharded: ClassVar[bool] = True

    def _start_shards(self) -> None:
        """The shards' state (called by the composed backend's ``__init__``)."""
        topology = self._topology
        assert isinstance(topology, ClusterTopology), "a redis-cluster:// URL"
        self._cluster_url = topology.parsed
        self._shards: dict[tuple[str, int], _Shard] = {}
        self._opening: dict[tuple[str, int], asyncio.Future[_Shard]] = {}
        # (S)SUBSCRIBE commands of this tick, not sent yet: one write per shard.
        self._shard_outbox: list[tuple[_Shard, bytes, bytes, asyncio.Future[None]]] = []
        self._trouble = asyncio.Event()
        self._moved: set[bytes] = set()

    @property
    def cluster(self) -> RedisCluster:
        """The cluster client (commands; pub/sub has connections of its own)."""
        return self._client  # type: ignore[return-value]

    def _shard_for(self, name: bytes) -> _Shard | None:
        for shard in self._shards.values():
            if name in shard.channels:
                return shard
        return None

    async def _pubsub_command(self, kind: bytes, name: bytes) -> None:
        """Send SSUBSCRIBE/SUNSUBSCRIBE on the shard of ``name`` and wait for Redis to
        confirm it; give up quietly when the shard is away (the resync restores it).
        While the node (re)subscribes (not ready), a subscribe waits for the pass that
        follows (the one under way may have taken its list of channels already); an
        unsubscribe is left to the end of the pass.

        The commands of one event-loop tick (a reconnect storm's thousands of
        subscribes) go out in one write per shard, in the order of the calls: one
        command per channel still, as Redis takes only channels of one slot in one
        SSUBSCRIBE and every channel has a slot of its own.

        Raises:
            BackendUnavailable: a subscribe while the node is not ready, that the next
                subscribe pass did not take within ``command_timeout``.
        """
        if not self._ready:
            if kind == self._SUBSCRIBE:
                self._moved.add(name)
                self._trouble.set()
                await self._next_pass()
            return  # an unsubscribe: the pass's end drops what is no longer wanted
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        waiters = self._waiters.setdefault((kind, name), deque())
        waiters.append(waiter)
        try:
            if kind == self._SUBSCRIBE:
                shard = await self._shard(self._owner(name))
                shard.channels.add(name)
            else:
                found = self._shard_for(name)
                if found is None:
                    return
                shard = found
                shard.channels.discard(name)
            self._shard_outbox.append((shard, kind, name, waiter))
            if len(self._shard_outbox) == 1:
                loop.call_soon(self._send_shard_outbox)
            async with asyncio.timeout(self.command_timeout):
                await waiter
        except (TimeoutError, *_ERRORS) as exc:
            log.debug("%r %r not confirmed (%s); restored by the resync", kind, name, exc)
            self._trouble.set()
        finally:
            self._forget_waiter((kind, name), waiters, waiter)

    async def _pass_ended(self, number: int) -> None:
        """Pass ``number`` subscribed its channels: release the subscribes recorded
        before it started, and drop what was unsubscribed meanwhile."""
        self._release_pass(number)
        wanted = self._channels | self._control_names()
        extra = [n for shard in self._shards.values() for n in shard.channels if n not in wanted]
        if extra:
            await asyncio.gather(*(self._pubsub_command(self._UNSUBSCRIBE, n) for n in extra))

    def _send_shard_outbox(self) -> None:
        # A waiter already done was cancelled, or released by a lost connection.
        batch = [item for item in self._shard_outbox if not item[3].done()]
        self._shard_outbox = []
        by_shard: dict[int, list[tuple[_Shard, bytes, bytes, asyncio.Future[None]]]] = {}
        for item in batch:
            by_shard.setdefault(id(item[0]), []).append(item)
        loop = asyncio.get_running_loop()
        for items in by_shard.values():
            task = loop.create_task(self._send_to_shard(items))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    @staticmethod
    async def _send_to_shard(
        items: list[tuple[_Shard, bytes, bytes, asyncio.Future[None]]],
    ) -> None:
        conn = items[0][0].conn
        try:
            packed = conn.pack_commands([(kind.upper(), name) for _, kind, name, _ in items])
            await conn.send_packed_command(packed, check_health=False)
        except _ERRORS as exc:
            for *_, waiter in items:
                if not waiter.done():
                    waiter.set_exception(exc)

    def _owner(self, name: bytes) -> tuple[str, int]:
        node = self.cluster.nodes_manager.get_node_from_slot(key_slot(name))
        return (node.host, int(node.port))

    async def _shard(self, address: tuple[str, int]) -> _Shard:
        shard = self._shards.get(address)
        if shard is not None and shard.alive:
            return shard
        opening = self._opening.get(address)
        if opening is not None:  # one connection per shard, however many callers race
            return await asyncio.shield(opening)
        opening = self._opening[address] = asyncio.get_running_loop().create_future()
        try:
            if shard is not None:  # lost, its loss not handled yet: the resync follows it
                self.breaks += 1  # it may have acknowledged what it never sent here
                self._moved |= shard.channels
                self._trouble.set()
                await self._close_shard(shard)
            shard = await self._open_shard(address)
        except BaseException as exc:
            failed = exc if isinstance(exc, Exception) else ConnectionError("cancelled")
            opening.set_exception(failed)  # the callers that wait get it raised
            opening.exception()  # (and no "never retrieved" warning if none waits)
            raise
        else:
            opening.set_result(shard)
        finally:
            del self._opening[address]
        return shard

    async def _open_shard(self, address: tuple[str, int]) -> _Shard:
        conn = self._shard_connection(address)
        await conn.connect()  # type: ignore[no-untyped-call]
        shard = _Shard(address, conn, pong_at=asyncio.get_running_loop().time())
        reader = PubSubReader(functools.partial(self._dispatch_shard, shard), self.read_delay)
        try:
            take_over(conn, reader)
        except BaseException:
            await conn.disconnect(nowait=True)
            raise
        shard.reader = reader
        self._shards[address] = shard
        # The task is kept alive by the reader's ``lost`` future, which the transport
        # (and so the event loop) holds through the reader, as long as it is open.
        shard.watch = asyncio.create_task(self._watch_shard(shard), name="redis-cluster-shard")
        return shard

    def _shard_connection(self, address: tuple[str, int]) -> AbstractConnection:
        parsed = self._cluster_url
        cls = SSLConnection if parsed.tls else Connection
        conn: AbstractConnection = cls(
            host=address[0],
            port=address[1],
            username=parsed.username,
            password=parsed.password,
            protocol=2,
            socket_timeout=None,  # an idle shard is normal: the heartbeat PINGs instead
            socket_connect_timeout=self.connect_timeout,
            socket_keepalive=True,
            retry=Retry(NoBackoff(), 0),
        )
        return conn

    async def _close_shard(self, shard: _Shard) -> None:
        if self._shards.get(shard.address) is shard:
            del self._shards[shard.address]
        if shard.watch is not None and shard.watch is not asyncio.current_task():
            shard.watch.cancel()
        with contextlib.suppress(*_ERRORS):
            await shard.conn.disconnect(nowait=True)

    def _dispatch_shard(self, shard: _Shard, reply: Any) -> None:
        """Handle one reply of ``shard``'s connection (called by its
        :class:`PubSubReader` for every reply of a wake-up in turn)."""
        kind = reply[0]
        if kind == b"smessage":
            self._message(reply[2])
        elif kind == b"pong":
            shard.pong_at = asyncio.get_running_loop().time()
        elif kind in (b"ssubscribe", b"sunsubscribe"):
            self._shard_confirm(shard, kind, reply[1])

    async def _watch_shard(self, shard: _Shard) -> None:
        """When ``shard``'s connection is lost (or a reply is unreadable, or an error
        such as MOVED): forget it, and let the resync subscribe its channels again."""
        reader = shard.reader
        assert reader is not None
        exc = await reader.lost
        log.warning("lost the shard at %s:%d (%s); resyncing", *shard.address, exc)
        self.breaks += 1  # it may have acknowledged a publication it never sent here
        if self._shards.get(shard.address) is shard:
            del self._shards[shard.address]
        self._moved |= shard.channels
        self._trouble.set()
        with contextlib.suppress(*_ERRORS):
            await shard.conn.disconnect(nowait=True)

    def _shard_confirm(self, shard: _Shard, kind: bytes, name: bytes) -> None:
        waiters = self._waiters.get((kind, name))
        if waiters:
            self._confirm(kind, name)
        elif kind == b"sunsubscribe" and name in shard.channels:
            # Not asked for: Redis dropped it because its slot moved to another node.
            shard.channels.discard(name)
            if name in self._channels or name in self._control_names():
                log.info("shard channel %r moved off %s:%d; following it", name, *shard.address)
                self._moved.add(name)
                self._trouble.set()

    def _control_names(self) -> set[bytes]:
        return {self._control_channel(app).encode() for app in self.apps}

    async def _connect(self) -> None:
        """Discover the cluster, subscribe every channel on its shard, write this node's
        state; then the node is ready."""
        for shard in list(self._shards.values()):
            await self._close_shard(shard)
        self._moved.clear()
        await self._refresh()
        await self._client.ping()
        number = self._pass_started()
        await self._subscribe_all([*self._control_names(), *self._channels])
        await self._restore()
        self._responsive = True
        self._ready = True
        if self._ever_connected:
            self.reconnects += 1
            log.info("reconnected to Redis Cluster %s (%d)", self.url, self.reconnects)
        else:
            log.info("connected to Redis Cluster %s as node %s", self.url, self._node_id)
        self._ever_connected = True
        await self._pass_ended(number)

    async def _subscribe_all(self, names: list[bytes]) -> None:
        """SSUBSCRIBE ``names`` on their owners, one command per shard, and wait for a
        PONG after them on each (then every one of them is in effect)."""
        by_owner: dict[tuple[str, int], list[bytes]] = {}
        for name in names:
            by_owner.setdefault(self._owner(name), []).append(name)
        for address, owned in by_owner.items():
            shard = await self._shard(address)
            shard.channels.update(owned)
            await self._ping_shard(shard, owned)

    async def _ping_shard(self, shard: _Shard, names: list[bytes]) -> None:
        loop = asyncio.get_running_loop()
        pinged = loop.time()
        by_slot: dict[int, list[bytes]] = {}
        for name in names:  # one SSUBSCRIBE names channels of one slot only
            by_slot.setdefault(key_slot(name), []).append(name)
        commands: list[list[bytes | str]] = [["SSUBSCRIBE", *same] for same in by_slot.values()]
        packed = shard.conn.pack_commands([*commands, ["PING"]])
        await shard.conn.send_packed_command(packed, check_health=False)
        async with asyncio.timeout(self.command_timeout):
            while shard.pong_at < pinged:
                if not shard.alive:
                    raise ConnectionError(f"shard {shard.address} lost while subscribing")
                await asyncio.sleep(0.005)

    async def _supervise(self) -> None:
        delay = self.reconnect_min
        while not self._stopped:
            if not self._ready:
                try:
                    await self._connect()
                except Exception as exc:
                    log.debug("Redis Cluster %s still unreachable (%s)", self.url, exc)
                    await asyncio.sleep(delay * (1 - random.random() / 2))  # noqa: S311
                    delay = min(delay * 2, self.reconnect_max)
                    continue
                delay = self.reconnect_min
            await self._trouble.wait()
            self._trouble.clear()
            try:
                await self._resync()
            except Exception as exc:
                log.warning("Redis Cluster %s: could not follow the cluster (%s)", self.url, exc)
                await self._lost(exc)
                await asyncio.sleep(delay * (1 - random.random() / 2))  # noqa: S311

    async def _resync(self) -> None:
        """Refresh the slot map and subscribe the moved channels on their new owners."""
        moved, self._moved = self._moved, set()
        number = self._pass_started()
        wanted = (self._channels | self._control_names()) & moved
        if not wanted:
            await self._pass_ended(number)
            return
        self._ready = False  # /ready reports the outage while a shard is away
        await self._refresh()
        await self._subscribe_all(sorted(wanted))
        await self._restore()
        self._ready = True
        self.reconnects += 1  # the hub fills what the moved channels missed
        await self._pass_ended(number)

    async def _refresh(self) -> None:
        """Read the slot map again (after a failover or a slot move)."""
        await self.cluster.initialize()  # the first time only
        await self.cluster.nodes_manager.initialize()

    async def _drop_pubsub(self) -> None:
        for shard in list(self._shards.values()):
            await self._close_shard(shard)

    async def _ping_pubsub(self) -> bool:
        """PING every shard's pub/sub connection; close those that stopped answering
        (the resync subscribes their channels again). The node beats on."""
        now = asyncio.get_running_loop().time()
        for shard in list(self._shards.values()):
            if now - shard.pong_at > 3 * self.heartbeat_interval:
                log.warning("shard %s:%d stopped answering PINGs", *shard.address)
                self.breaks += 1  # cut off or frozen: it may still take others' writes
                self._moved |= shard.channels
                await self._close_shard(shard)
                self._trouble.set()
            else:
                await shard.conn.send_command("PING", check_health=False)
        return True

    async def _after_probe(self) -> None:
        """Perhaps a failover: ask the cluster who serves now."""
        with contextlib.suppress(*_ERRORS, RedisClusterException):
            await self._prober.nodes_manager.initialize()  # type: ignore[attr-defined]


class ShardBatches(Outbox):
    """Batches as one cluster pipeline (one round trip per shard); in the durable mode
    each shard's publications followed by ``WAIT`` on the same connection."""

    @property
    def _cluster(self) -> RedisCluster:
        return self._client  # type: ignore[return-value]

    async def _publish_batch(self, batch: list[PendingPublication]) -> None:
        try:
            results = await self._cluster_pipeline(batch)
        except (*_ERRORS, RedisClusterException) as exc:
            results = [exc] * len(batch)
        for item, result in zip(batch, results, strict=True):
            if item.done.done():
                continue
            if isinstance(result, NotReplicated):
                item.done.set_exception(result)
            elif isinstance(result, BaseException):
                # A timeout came after the pipeline was written: it may have gone out.
                # (redis-py does not say whether a lost connection was before or after.)
                sent = isinstance(result, RedisTimeoutError)
                error = self._failed("publish", result, sent=sent)
                error.__cause__ = result
                item.done.set_exception(error)
            else:
                item.done.set_result(result)

    async def _cluster_pipeline(self, batch: list[PendingPublication]) -> list[Any]:
        """Publish ``batch`` in one pipeline (one round trip per shard); per publication
        its position, None, or its error. In the durable mode (``wait_replicas``) the
        publications with history go to their shards apart, each shard's followed by
        ``WAIT`` on the same connection (:meth:`_durable`)."""
        script = scripts.PUBLISH
        size, ttl, meta_ttl = self.history_size, self.history_ttl, self.history_meta_ttl
        calls: list[Call | None] = []
        durable = bool(self.wait_replicas)
        pipe = self._cluster.pipeline()
        piped = 0
        for item in batch:
            p = item.publication
            if item.history:
                keys, args = publish_script_args(self.prefix, p, size, ttl, meta_ttl, sharded=True)
                calls.append((keys, args))
                if not durable:
                    pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
                    piped += 1
            else:
                calls.append(None)
                name = publication_channel(self.prefix, p.app_id, p.channel)
                pipe.spublish(name, encode_publication(p))
                piped += 1
        waited = await self._durable(calls) if durable else {}
        piped_replies = iter(await pipe.execute(raise_on_error=False) if piped else ())
        replies = [waited[i] if i in waited else next(piped_replies) for i in range(len(calls))]
        results: list[Any] = []
        for call, reply in zip(calls, replies, strict=True):
            if call is not None and isinstance(reply, NoScriptError):  # a new primary
                try:
                    reply = await self._cluster.eval(script.source, 2, *call[0], *call[1])
                except _ERRORS as exc:
                    reply = exc
            results.append(publish_result(reply, call is not None))
        return results

    async def _durable(self, calls: list[Call | None]) -> dict[int, Any]:
        """Publish the ``calls`` with history shard by shard, each shard's batch followed
        by ``WAIT`` (which confirms the writes of its connection): index -> the reply,
        its error, or :class:`NotReplicated` when the shard's replicas fell short."""
        groups: dict[str, tuple[ClusterNode, list[int]]] = {}
        for index, call in enumerate(calls):
            if call is not None:
                node = self._cluster.get_node_from_key(call[0][0])
                if node is None:
                    raise RedisClusterException(f"no shard serves {call[0][0]!r} now")
                groups.setdefault(node.name, (node, []))[1].append(index)

        async def shard(node: ClusterNode, indexes: list[int]) -> list[Any]:
            group = [call for i in indexes if (call := calls[i]) is not None]
            try:
                replies, kept = await publish_and_wait(
                    node, group, self.wait_replicas, self.wait_timeout
                )
            except _ERRORS as exc:
                with contextlib.suppress(*_ERRORS, RedisClusterException):
                    await self._cluster.nodes_manager.initialize()  # a failover, perhaps
                return [exc] * len(indexes)
            return self._unreplicated(group, replies, kept)

        found = await asyncio.gather(*(shard(node, ix) for node, ix in groups.values()))
        return {
            i: reply
            for (_, indexes), replies in zip(groups.values(), found, strict=True)
            for i, reply in zip(indexes, replies, strict=True)
        }

    async def _drop_publisher(self) -> None:
        return None  # the cluster client's connections carry the publications


class RedisClusterBackend(ShardedPubSub, ShardBatches, PresenceAndCounts, Liveness):
    """The Redis backend over Redis Cluster (see the module's docstring); same options
    as :class:`~broadcaster.backends.redis.RedisBackend`, and a ``redis-cluster://``
    URL.

    Raises:
        ValueError: for an invalid URL or option, naming it.
    """

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        self._start_shards()
