"""Publish batching: the publications of one event-loop tick go out together, one
round trip per batch, in the order of the calls (:class:`Outbox`), on the
publications' own connection (:class:`ConnectionBatches`: standalone Redis, Sentinel;
Redis Cluster pipelines per shard, :class:`broadcaster.backends.redis.cluster.
ShardBatches`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import (
    NoScriptError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from broadcaster.backends.base import (
    BackendUnavailable,
    NotReplicated,
    new_epoch,
)
from broadcaster.backends.redis import scripts
from broadcaster.backends.redis.codec import (
    encode_publication,
    ms,
    publish_result,
)
from broadcaster.backends.redis.core import (
    ERRORS,
    BackendCore,
    PendingPublication,
    refusal_of,
)
from broadcaster.backends.redis.layout import (
    publication_channel,
)
from broadcaster.backends.redis.publish import (
    PublishPacker,
    publish_script_args,
)
from broadcaster.backends.redis.resp import (
    connected_reply_reader,
    pack_commands,
    round_trip,
)
from broadcaster.publication import Position, Publication

__all__ = ["ConnectionBatches", "Outbox"]

log = logging.getLogger(__name__)

_ERRORS = ERRORS


class Outbox(BackendCore):
    """The publications of this tick, sent in one batch when none is in flight."""

    def publish(
        self, publication: Publication, *, history: bool = True
    ) -> asyncio.Future[Position | None]:
        """See :meth:`broadcaster.backends.base.Backend.publish`: a future of the
        position (so gathering many publications makes no task per publication).

        Publications go to Redis in batches, one round trip each, in the order of the
        calls: those of one event-loop tick (a batch of the HTTP API, an event on
        several channels, concurrent requests) together, and those made while a batch
        is in flight together once it is answered.

        Raises:
            BackendUnavailable: (from the future) Redis is unreachable (nothing was
                published) or a command timed out (the publication may or may not have
                gone out).
        """
        loop = self._running_loop()
        done: asyncio.Future[Position | None] = loop.create_future()
        try:
            self._check_ready()
        except BackendUnavailable as exc:
            done.set_exception(exc)
            return done
        self._outbox.append(PendingPublication(publication, history, done))
        if len(self._outbox) == 1 and not self._publishing:
            loop.call_soon(self._send_outbox)
        return done

    def _send_outbox(self) -> None:
        if self._publishing or not self._outbox:
            return  # the batch in flight sends the rest when it is answered
        batch, self._outbox = self._outbox, []
        self._publishing = True
        task = self._running_loop().create_task(self._publish_batch(batch))
        self._sending.add(task)
        task.add_done_callback(self._batch_done)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        """The running loop: the one the backend started in while it runs, without
        the getpid system call of ``asyncio.get_running_loop()`` (publish path)."""
        loop = self._loop
        return asyncio.get_running_loop() if loop is None or self._stopped else loop

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        self._sending.discard(task)
        self._publishing = False
        self._send_outbox()

    def _unreplicated(
        self, calls: Sequence[object | None], results: list[Any], kept: Any
    ) -> list[Any]:
        """``results`` with each publication kept in history refused when ``kept`` (the
        ``WAIT`` reply, or its error) is short of ``wait_replicas``."""
        if not isinstance(kept, BaseException) and int(kept) >= self.wait_replicas:
            return results
        if isinstance(kept, BaseException):
            why = f"WAIT failed: {kept}"
        else:
            why = f"{kept} confirmed it within {self.wait_timeout:g} s"
        refused = NotReplicated(
            f"the publication is not acknowledged: {self.wait_replicas} Redis replica(s) "
            f"must keep it (--redis-wait-replicas) and {why}; it may still be in the "
            "primary's history, so a retry may deliver it twice"
        )
        return [
            refused if call is not None and not isinstance(result, BaseException) else result
            for call, result in zip(calls, results, strict=True)
        ]

    async def _publish_batch(self, batch: list[PendingPublication]) -> None:
        """Publish ``batch`` and settle every publication's future."""
        raise NotImplementedError


class ConnectionBatches(Outbox):
    """Batches on the publications' own connection to the primary, driven directly
    (packed commands, a :class:`~broadcaster.backends.redis.resp.ReplyReader`), with
    one deadline per batch."""

    _packer: PublishPacker | None = None  # made at the first batch, with the options

    async def _publish_batch(self, batch: list[PendingPublication]) -> None:
        loop = self._running_loop()
        waits = self.wait_timeout if self.wait_replicas else 0.0
        self._batch_deadline = loop.time() + self.command_timeout + waits
        self._batch_expired = False
        self._batch_sent = False
        if self._watchdog is None:
            self._watchdog = loop.call_at(self._batch_deadline, self._watch_batch)
        try:
            results = await self._pipeline(batch)
        except asyncio.CancelledError:
            if not self._batch_expired:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            await self._drop_publisher()  # replies may still come: not for the next batch
            timeout = RedisTimeoutError(f"no answer within {self.command_timeout:g} s")
            results = [timeout] * len(batch)
        except _ERRORS as exc:
            await self._drop_publisher()
            results = [exc] * len(batch)
        finally:
            self._batch_deadline = None
        replica = False  # the connection reached a replica: follow the primary
        sent = self._batch_sent  # then a publication without an answer may be out
        for item, result in zip(batch, results, strict=True):
            if isinstance(result, NotReplicated):
                if not item.done.done():
                    item.done.set_exception(result)
            elif isinstance(result, BaseException):
                replica = replica or (refusal_of(result) or "").startswith("READONLY")
                if not item.done.done():  # else the caller was cancelled
                    error = self._failed("publish", result, sent=sent)
                    error.__cause__ = result
                    item.done.set_exception(error)
            elif not item.done.done():
                item.done.set_result(result)
        if replica:
            await self._follow_primary()

    def _watch_batch(self) -> None:
        """Cancel the batch in flight if its deadline passed; else wait for it."""
        self._watchdog = None
        deadline = self._batch_deadline
        if deadline is None or self._batch_expired:
            return  # nothing in flight: the next batch arms the timer again
        loop = asyncio.get_running_loop()
        if loop.time() < deadline:
            self._watchdog = loop.call_at(deadline, self._watch_batch)
            return
        # The batch's task is suspended in _pipeline (the deadline is cleared as soon
        # as it returns), so the cancellation lands there.
        self._batch_expired = True
        for task in self._sending:
            task.cancel()

    async def _pipeline(self, batch: list[PendingPublication]) -> list[Any]:
        """Publish ``batch`` in one round trip on the publications' connection; a
        result (position or None) or the error per publication.

        The connection is driven directly (the commands packed here, the replies read
        in order), without a client, a pool or a pipeline object; its caller sets the
        deadline."""
        script = scripts.PUBLISH
        calls: list[Publication | None] = []
        packed: list[bytes] = []  # one packed command each
        mixed = len({item.history for item in batch}) > 1
        if mixed:
            # A Redis without the script would run the plain PUBLISHes at once and
            # the scripted ones only when sent again: load it first to keep order.
            packed.append(pack_commands([("SCRIPT", "LOAD", script.source)]))
        # One epoch for the batch (it only serves a channel that the batch creates, and
        # a batch creates a channel once).
        epoch = new_epoch()
        packer = self._packer
        if packer is None:
            packer = self._packer = PublishPacker(
                self.prefix,
                self.history_size,
                self.history_ttl,
                self.history_meta_ttl,
                sharded=self._sharded,
            )
        for item in batch:
            p = item.publication
            if item.history:
                calls.append(p)
                packed.append(packer.evalsha(p, epoch))
            else:
                calls.append(None)
                name = publication_channel(self.prefix, p.app_id, p.channel)
                packed.append(pack_commands([("PUBLISH", name, encode_publication(p))]))
        # The durable mode: WAIT on this connection confirms the writes sent before it.
        waits = bool(self.wait_replicas) and any(call is not None for call in calls)
        if waits:
            packed.append(pack_commands([("WAIT", self.wait_replicas, ms(self.wait_timeout))]))
        if self._publisher is None:
            conn = self._new_publish_connection()
            self._publisher = (conn, await connected_reply_reader(conn))
        reader = self._publisher[1]
        waiter = reader.expect(len(packed))  # each command's error is its reply
        reader.write(b"".join(packed))
        self._batch_sent = True
        replies = await waiter
        if mixed:
            replies = replies[1:]
        kept = replies.pop() if waits else None
        results: list[Any] = []
        for call, reply in zip(calls, replies, strict=True):
            if call is not None and isinstance(reply, NoScriptError):  # a restarted Redis
                args = publish_script_args(
                    self.prefix,
                    call,
                    self.history_size,
                    self.history_ttl,
                    self.history_meta_ttl,
                    epoch,
                    sharded=self._sharded,
                )
                try:
                    reply = await self._eval(script, args, waits)
                except _ERRORS as exc:
                    reply = exc
            results.append(publish_result(reply, call is not None))
        if waits:
            results = self._unreplicated(calls, results, kept)
        return results

    async def _eval(
        self,
        script: scripts.Script,
        call: tuple[tuple[str, str], tuple[str | int | bytes, ...]],
        waits: bool,
    ) -> Any:
        """Run the publish script by its source (Redis lacked it) on a pooled
        connection; in the durable mode with its own ``WAIT`` there (the batch's covers
        only the publications' connection): its reply, or :class:`NotReplicated`."""
        keys, args = call
        if not waits:
            return await self._client.eval(script.source, len(keys), *keys, *args)
        commands = [("EVAL", script.source, len(keys), *keys, *args)]
        commands.append(("WAIT", self.wait_replicas, ms(self.wait_timeout)))
        reply, kept = await round_trip(self._client, pack_commands(commands), 2, self.wait_timeout)
        return self._unreplicated([call], [reply], kept)[0]

    def _new_publish_connection(self) -> AbstractConnection:
        # No socket timeout: each batch has one deadline (_publish_batch) instead of a
        # timer per write and per reply. Read by a ReplyReader once connected.
        return self._topology.connection(socket_timeout=None)

    async def _follow_primary(self) -> None:
        """The publications' connection reached a replica (``READONLY``): open a new one
        for the next batch; where the primary moves (Sentinel), reconnect the pub/sub
        connection too (the reconnection asks where the primary is)."""
        # No break: it read the old primary until it was demoted, and took no writes since.
        await self._drop_publisher()
        if self._topology.locates:
            await self._drop_pubsub()

    async def _switched(self, host: str, port: int) -> None:
        """Sentinel named the primary at ``host:port``: move every connection there,
        unless already there."""
        if self._topology.at(host, port):
            return  # already there (reconnected after the old primary died)
        log.warning("Redis at %s: the primary is now %s:%d; following it", self.url, host, port)
        reader = self._reader
        if reader is not None and not reader.lost.done():
            # Still reading the old primary, which may take other nodes' publications
            # until Sentinel demotes it. (After it died, the loss counted the break.)
            self.breaks += 1
        await self._drop_publisher()
        await self._drop_pubsub()  # the node reconnects, asking where the primary is
        with contextlib.suppress(*_ERRORS):
            await self._client.connection_pool.disconnect()
        self._retry_now.set()  # a reconnection waiting out its back-off goes now

    async def _drop_publisher(self) -> None:
        """Close the publications' connection; the next batch opens a new one (to the
        address of the day, after a reconnection or a Sentinel failover)."""
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            with contextlib.suppress(*_ERRORS):
                await publisher[0].disconnect(nowait=True)
