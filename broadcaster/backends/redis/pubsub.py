"""Pub/sub: subscribe passes, confirmations and message dispatch (:class:`PubSubBase`),
and one pub/sub connection to the primary (:class:`OneConnection`: standalone Redis,
Sentinel). Redis Cluster's sharded pub/sub is :class:`broadcaster.backends.redis.
cluster.ShardedPubSub`, on the same base.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import deque
from typing import Any

import orjson
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError

from broadcaster.backends.base import (
    BackendUnavailable,
)
from broadcaster.backends.redis.codec import (
    decode_publication,
    split_payload,
)
from broadcaster.backends.redis.core import (
    ERRORS,
    BackendCore,
)
from broadcaster.backends.redis.layout import (
    publication_channel,
)
from broadcaster.backends.redis.resp import (
    PubSubReader,
    take_over,
)

__all__ = ["OneConnection", "PubSubBase"]

log = logging.getLogger(__name__)

_ERRORS = ERRORS


class PubSubBase(BackendCore):
    """What every pub/sub shares: the channels wanted, subscribe passes, waiters and
    the dispatch of a message to the handlers."""

    async def subscribe(self, app_id: str, channel: str) -> None:
        """Receive ``channel`` on this node; returns once Redis confirmed it. While the
        node reconnects (or, on a cluster, resyncs), it returns once that pass has
        subscribed it.

        Raises:
            BackendUnavailable: no such pass within ``command_timeout``.
        """
        name = publication_channel(self.prefix, app_id, channel).encode()
        if name not in self._channels:
            self._channels.add(name)
            try:
                await self._pubsub_command(self._SUBSCRIBE, name)
            except BackendUnavailable:
                self._channels.discard(name)
                raise

    async def unsubscribe(self, app_id: str, channel: str) -> None:
        """Stop receiving ``channel``; returns once Redis confirmed it (or at once while
        Redis, or the channel's shard, is away)."""
        name = publication_channel(self.prefix, app_id, channel).encode()
        if name in self._channels:
            self._channels.discard(name)
            await self._pubsub_command(self._UNSUBSCRIBE, name)

    def _message(self, data: bytes) -> None:
        """Deliver one pub/sub message: a publication (format 2, or 1 from an older
        publisher) or a control message (a JSON object)."""
        on_encoded = self._on_encoded
        if on_encoded is not None and data[:1] == b"2":  # the hot path: no JSON at all
            try:
                parts = split_payload(data)
            except ValueError:
                log.warning("dropped a malformed publication: %r", data[:200])
                return
            try:
                on_encoded(*parts)
            except Exception:
                log.exception("publication handler failed on %r", data[:120])
            return
        if data[:1] == b"{":
            self._control(data)
            return
        try:
            publication = decode_publication(data)
        except ValueError:
            log.warning("dropped a malformed publication: %r", data[:200])
            return
        try:
            self._on_publication(publication)  # type: ignore[misc]
        except Exception:
            log.exception("publication handler failed on %r", data[:120])

    def _control(self, data: bytes) -> None:
        try:
            decoded = orjson.loads(data)
            app_id, message = decoded["app"], decoded["message"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            log.warning("dropped a malformed control message: %r", data[:200])
            return
        if self._on_control is None:
            return
        try:
            self._on_control(app_id, message)
        except Exception:
            log.exception("control handler failed on a message of app %s", app_id)

    async def _next_pass(self) -> None:
        """Wait until a subscribe pass that starts from now has ended (it takes every
        channel recorded before it started), ``command_timeout`` at most.

        Raises:
            BackendUnavailable: no pass ended in time.
        """
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (self._passes, waiter)
        self._pass_waiters.append(entry)
        try:
            async with asyncio.timeout(self.command_timeout):
                await waiter
        except TimeoutError:
            raise BackendUnavailable(
                f"the node is reconnecting to Redis at {self.url}; subscribe again later"
            ) from None
        finally:
            if entry in self._pass_waiters:
                self._pass_waiters.remove(entry)

    def _pass_started(self) -> int:
        self._passes += 1
        return self._passes

    def _release_pass(self, number: int) -> None:
        """Pass ``number`` subscribed its channels: release the subscribes that were
        recorded before it started."""
        waiting, self._pass_waiters = self._pass_waiters, []
        for after, waiter in waiting:
            if after >= number:
                self._pass_waiters.append((after, waiter))
            elif not waiter.done():
                waiter.set_result(None)

    def _forget_waiter(
        self,
        key: tuple[bytes, bytes],
        waiters: deque[asyncio.Future[None]],
        waiter: asyncio.Future[None],
    ) -> None:
        """Drop a (un)subscribe's waiter, and the channel's entry once it has none (one
        entry per channel ever used would add up)."""
        if waiter in waiters:
            waiters.remove(waiter)
        if not waiters and self._waiters.get(key) is waiters:
            del self._waiters[key]

    def _confirm(self, kind: bytes, name: bytes) -> None:
        waiters = self._waiters.get((kind, name))
        if waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    async def _lost(self, exc: BaseException) -> None:
        self._ready = False
        # Redis writes a publication's acknowledgement and its pub/sub copies to each
        # connection separately: one that died may have acknowledged a publication this
        # node never got. Same store again: its history shows it; another: unprovable.
        self.breaks += 1
        log.warning("lost the connection to Redis at %s (%s); reconnecting", self.url, exc)
        await self._drop_pubsub()
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)
        self._waiters.clear()

    async def _pubsub_command(self, kind: bytes, name: bytes) -> None:
        """Send a (un)subscribe of ``name`` and wait for Redis to confirm it."""
        raise NotImplementedError


class OneConnection(PubSubBase):
    """One pub/sub connection to the primary (standalone Redis, Sentinel), read by a
    :class:`~broadcaster.backends.redis.resp.PubSubReader` (which takes the direct
    routes); lost, the node is not ready and reconnects everything."""

    _direct_routes = True

    def _new_pubsub_connection(self) -> AbstractConnection:
        # No socket timeout: an idle channel is normal. The heartbeat PINGs instead.
        return self._topology.connection(socket_timeout=None, socket_keepalive=True)

    async def _connect(self) -> None:
        """Connect both connections, subscribe to everything this node had and write its
        state; then the node is ready."""
        await self._topology.locate()
        await self._client.connection_pool.disconnect()
        await self._drop_publisher()
        await self._client.ping()
        conn = self._new_pubsub_connection()
        try:
            await conn.connect()  # type: ignore[no-untyped-call]
            reader = PubSubReader(
                self._dispatch, self.read_delay, on_message=self._message, routes=self.routes
            )
            take_over(conn, reader)
            self._pubsub = conn
            self._reader = reader
            number = self._pass_started()
            names = [self._control_channel(app).encode() for app in self.apps]
            names += self._channels
            if names:
                await conn.send_command("SUBSCRIBE", *names, check_health=False)
            await self._await_pong(conn)
            await self._restore()
        except BaseException:
            self._pubsub = self._reader = None
            await conn.disconnect(nowait=True)
            raise
        self._pong_at = asyncio.get_running_loop().time()
        self._responsive = True  # it just answered
        self._ready = True
        self._release_pass(number)  # subscribes made meanwhile: in ``names`` above
        if self._ever_connected:
            self.reconnects += 1
            log.info("reconnected to Redis at %s (reconnection %d)", self.url, self.reconnects)
        else:
            log.info("connected to Redis at %s as node %s", self.url, self._node_id)
        self._ever_connected = True

    async def _supervise(self) -> None:
        delay = self.reconnect_min
        while not self._stopped:
            reader = self._reader
            if self._pubsub is None or reader is None:
                try:
                    await self._connect()
                except Exception as exc:
                    pause = delay * (1 - random.random() / 2)  # noqa: S311 - jitter, not crypto
                    log.debug("Redis at %s still unreachable (%s)", self.url, exc)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(pause):  # or until told where Redis is
                            await self._retry_now.wait()
                    self._retry_now.clear()
                    delay = min(delay * 2, self.reconnect_max)
                    continue
                delay = self.reconnect_min
                continue
            await self._lost(await reader.lost)

    async def _drop_pubsub(self) -> None:
        conn, self._pubsub, self._reader = self._pubsub, None, None
        if conn is not None:
            with contextlib.suppress(*_ERRORS):
                await conn.disconnect(nowait=True)

    def _dispatch(self, reply: Any) -> None:
        """Handle one reply of the pub/sub connection (called by :class:`PubSubReader`
        for every reply of a wake-up in turn)."""
        kind = reply[0]
        if kind == b"message":
            self._message(reply[2])
        elif kind == b"pong" or reply == b"PONG":  # PONG: PING before any SUBSCRIBE
            self._pong_at = asyncio.get_running_loop().time()
            waiter, self._pong_waiter = self._pong_waiter, None
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        elif kind in (b"subscribe", b"unsubscribe"):
            self._confirm(kind, reply[1])

    async def _await_pong(self, conn: AbstractConnection) -> None:
        """PING and wait for the PONG: every SUBSCRIBE sent before is then in effect.

        Raises:
            TimeoutError: no PONG within ``command_timeout``.
            redis.exceptions.ConnectionError: the connection was lost meanwhile.
        """
        reader = self._reader
        assert reader is not None
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pong_waiter = waiter
        await conn.send_command("PING", check_health=False)
        async with asyncio.timeout(self.command_timeout):
            either: list[asyncio.Future[Any]] = [waiter, reader.lost]
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not waiter.done():
            raise RedisConnectionError(f"lost the pub/sub connection: {reader.lost.result()}")

    async def _pubsub_command(self, kind: bytes, name: bytes) -> None:
        """Send SUBSCRIBE/UNSUBSCRIBE and wait for Redis to confirm it; give up quietly
        when the connection is lost (the reconnection restores ``_channels``). Without a
        connection, a SUBSCRIBE waits for the reconnection (which subscribes everything
        in ``_channels``), at most ``command_timeout``, else BackendUnavailable.

        The commands of one event-loop tick go out together (one SUBSCRIBE naming many
        channels), in the order of the calls; each caller waits for its own channel's
        confirmation."""
        conn = self._pubsub
        if conn is None or not conn.is_connected:
            if kind == self._SUBSCRIBE and not self._stopped:
                await self._next_pass()
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        waiters = self._waiters.get((kind, name))
        if waiters is None:
            waiters = self._waiters[(kind, name)] = deque()
        waiters.append(waiter)
        self._pubsub_outbox.append((kind, name, waiter))
        if len(self._pubsub_outbox) == 1:
            loop.call_soon(self._send_pubsub_outbox)
        try:
            await waiter
        finally:
            self._forget_waiter((kind, name), waiters, waiter)

    def _send_pubsub_outbox(self) -> None:
        # Commands whose waiter is done were cancelled, or overtaken by a lost
        # connection (then the reconnection subscribes to what ``_channels`` holds).
        batch = [item for item in self._pubsub_outbox if not item[2].done()]
        self._pubsub_outbox = []
        conn = self._pubsub
        if not batch:
            return
        if conn is None or not conn.is_connected:
            _give_up(batch, "no connection")
            return
        commands: list[list[bytes]] = []
        for kind, name, _ in batch:
            if commands and commands[-1][0] == kind:
                commands[-1].append(name)
            else:
                commands.append([kind, name])
        loop = asyncio.get_running_loop()
        task = loop.create_task(self._send_pubsub(conn, commands, batch))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)
        loop.call_later(self.command_timeout, _give_up, batch, "timed out")

    @staticmethod
    async def _send_pubsub(
        conn: AbstractConnection,
        commands: list[list[bytes]],
        batch: list[tuple[bytes, bytes, asyncio.Future[None]]],
    ) -> None:
        try:
            packed = conn.pack_commands([(kind.upper(), *names) for kind, *names in commands])
            await conn.send_packed_command(packed, check_health=False)
        except _ERRORS as exc:
            _give_up(batch, str(exc))

    async def _ping_pubsub(self) -> bool:
        """PING the pub/sub connection; drop it (False) if it stopped answering."""
        conn = self._pubsub
        loop = asyncio.get_running_loop()
        if conn is not None and loop.time() - self._pong_at > 3 * self.heartbeat_interval:
            log.warning("Redis at %s stopped answering PINGs on the pub/sub connection", self.url)
            self.breaks += 1  # frozen or cut off: it may still take others' publications
            await self._drop_pubsub()  # the reader fails and the node reconnects
            return False
        if conn is not None:
            await conn.send_command("PING", check_health=False)
        return True

    async def _after_probe(self) -> None:
        return None


def _give_up(batch: list[tuple[bytes, bytes, asyncio.Future[None]]], reason: str) -> None:
    """Release the callers of pub/sub commands not confirmed (a reconnection restores
    the subscriptions)."""
    for kind, name, waiter in batch:
        if not waiter.done():
            log.debug("%s %r not confirmed (%s); restored on reconnection", kind, name, reason)
            waiter.set_result(None)
