"""Publish batching: the publications of one event-loop tick go out together, one
round trip per batch, in the order of the calls (:class:`Outbox`), on the
publications' own connection (:class:`ConnectionBatches`: standalone Redis, Sentinel;
Redis Cluster pipelines per shard, :class:`broadcaster.backends.redis.cluster.
ShardBatches`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Coroutine, Sequence
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
    position_of,
    publish_result,
)
from broadcaster.backends.redis.core import (
    ERRORS,
    BackendCore,
    PendingPublication,
    pending_publication,
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
        loop = self._loop  # as _running_loop(), inlined: this runs per publication
        if loop is None or self._stopped:
            loop = asyncio.get_running_loop()
        done: asyncio.Future[Position | None] = loop.create_future()
        if self._stopped or not self._ready:
            try:
                self._check_ready()
            except BackendUnavailable as exc:
                done.set_exception(exc)
                return done
        outbox = self._outbox
        outbox.append(pending_publication(publication, history, done))
        if len(outbox) == 1 and not self._publishing:
            loop.call_soon(self._send_outbox)
        return done

    def _send_outbox(self) -> None:
        if self._publishing or not self._outbox:
            return  # the batch in flight sends the rest when it is answered
        batch, self._outbox = self._outbox, []
        self._publishing = True
        if not self._send_directly(batch):
            self._run_batch(self._publish_batch(batch))

    def _run_batch(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` (the batch in flight, or what is left of it) in a task; the
        next batch goes when it ends."""
        task = self._running_loop().create_task(work)
        self._sending.add(task)
        task.add_done_callback(self._batch_done)

    def _send_directly(self, batch: list[PendingPublication]) -> bool:
        """Send ``batch`` without a task if this kind of batch can (and settle it when
        its replies are read); False: it goes in a task (:meth:`_publish_batch`)."""
        return False

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


class _Flight:
    """A batch that :meth:`ConnectionBatches._send_directly` sent without a task, until
    its replies (or the connection's error) arrive or its deadline passes."""

    __slots__ = ("batch", "calls", "epoch", "landed", "replies")

    def __init__(
        self, batch: list[PendingPublication], calls: list[Publication | None], epoch: str
    ) -> None:
        self.batch = batch
        self.calls = calls
        self.epoch = epoch
        self.replies: list[Any] | BaseException | None = None  # once they arrived
        self.landed: asyncio.Future[None] | None = None  # made if stop() waits for it


class ConnectionBatches(Outbox):
    """Batches on the publications' own connection to the primary, driven directly
    (packed commands, a :class:`~broadcaster.backends.redis.resp.ReplyReader`), with
    one deadline per batch.

    The usual batch (the connection is up, publications all with history or all
    without, not the durable mode) goes without a task: :meth:`_send_directly` writes
    it and the reader hands its replies to a plain call that settles the publications,
    and sends the next batch, from the read itself. Anything else, and any such batch
    whose replies are not all successes (``NOSCRIPT``, ``READONLY``, an error reply, a
    lost connection) or whose deadline passes, goes through :meth:`_publish_batch` in a
    task, as before: one error mapping, one retry, one deadline for both ways.
    """

    _packer: PublishPacker | None = None  # made at the first batch, with the options
    _flight: _Flight | None = None  # the batch sent without a task, until it is answered

    def _send_directly(self, batch: list[PendingPublication]) -> bool:
        publisher = self._publisher
        if publisher is None or self.wait_replicas:
            return False  # not connected yet, or the durable mode's WAIT
        reader = publisher[1]
        if reader.lost.done():
            return False
        history = batch[0].history
        for item in batch:
            if item.history != history:
                return False  # mixed: the script is loaded first (_pipeline)
        try:
            calls, packed, _, _, epoch = self._pack(batch, False)
        except Exception:  # the task meets it again, and fails as before
            return False
        self._arm_deadline(self._running_loop())
        flight = self._flight = _Flight(batch, calls, epoch)
        reader.expect_call(len(packed), functools.partial(self._flight_arrived, flight))
        try:
            reader.write(b"".join(packed))
        except _ERRORS as exc:
            self._flight_arrived(flight, exc)  # the task drops the connection
            return True
        self._batch_sent = True
        return True

    def _flight_arrived(self, flight: _Flight, replies: list[Any] | BaseException) -> None:
        """The replies of the batch sent without a task (or the connection's error),
        from the reader: successes settle it here, anything else goes on in a task."""
        if self._flight is not flight:
            return  # its deadline passed: settled already
        self._flight = None
        flight.replies = replies
        results: list[Position | None] = []
        if isinstance(replies, list):
            try:
                for call, reply in zip(flight.calls, replies, strict=True):
                    if isinstance(reply, BaseException):
                        break  # an error reply: the task maps it (and retries NOSCRIPT)
                    results.append(None if call is None else position_of(reply))
            except Exception:  # an odd reply: the task meets it again
                results = []
        if len(results) != len(flight.batch):
            self._run_batch(self._publish_batch(flight.batch, flight))
            self._landed(flight)
            return
        self._batch_deadline = None
        for item, result in zip(flight.batch, results, strict=True):
            if not item.done.done():  # else the caller was cancelled
                item.done.set_result(result)
        self._publishing = False
        if flight.landed is not None:
            self._landed(flight)
        if self._outbox:
            self._send_outbox()

    def _landed(self, flight: _Flight) -> None:
        landed = flight.landed
        if landed is not None and not landed.done():
            landed.set_result(None)

    async def _sent(self) -> None:
        while True:
            flight = self._flight
            if flight is not None:
                if flight.landed is None:
                    flight.landed = self._running_loop().create_future()
                await flight.landed
            elif self._sending:
                await asyncio.gather(*self._sending, return_exceptions=True)
            else:
                return

    def _arm_deadline(self, loop: asyncio.AbstractEventLoop) -> None:
        waits = self.wait_timeout if self.wait_replicas else 0.0
        self._batch_deadline = loop.time() + self.command_timeout + waits
        self._batch_expired = False
        self._batch_sent = False
        if self._watchdog is None:
            self._watchdog = loop.call_at(self._batch_deadline, self._watch_batch)

    async def _publish_batch(
        self, batch: list[PendingPublication], flight: _Flight | None = None
    ) -> None:
        """Publish ``batch`` and settle every publication's future; or settle a batch
        that ``flight`` sent (within its deadline, armed then)."""
        if flight is None:
            self._arm_deadline(self._running_loop())
        try:
            results = await self._pipeline(batch, flight)
        except asyncio.CancelledError:
            if not self._batch_expired:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            results = await self._timed_out(len(batch))
        except _ERRORS as exc:
            await self._drop_publisher()
            results = [exc] * len(batch)
        finally:
            self._batch_deadline = None
        await self._settle(batch, results)

    async def _expired(self, batch: list[PendingPublication]) -> None:
        """Settle a batch sent without a task whose deadline passed."""
        try:
            results = await self._timed_out(len(batch))
        finally:
            self._batch_deadline = None
        await self._settle(batch, results)

    async def _timed_out(self, count: int) -> list[Any]:
        await self._drop_publisher()  # replies may still come: not for the next batch
        return [RedisTimeoutError(f"no answer within {self.command_timeout:g} s")] * count

    async def _settle(self, batch: list[PendingPublication], results: list[Any]) -> None:
        """Settle every publication's future with its result (or error)."""
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
        flight, self._flight = self._flight, None
        if flight is not None:  # sent without a task: its replies will be ignored
            self._run_batch(self._expired(flight.batch))
            self._landed(flight)

    def _pack(
        self, batch: list[PendingPublication], mixed: bool | None = None
    ) -> tuple[list[Publication | None], list[bytes], bool, bool, str]:
        """``batch``'s commands, packed one each: per publication its publication (None
        for a plain ``PUBLISH``), the commands, whether the script is loaded first
        (``mixed``: publications with and without history; found here if not given),
        whether ``WAIT`` ends them, and the batch's epoch."""
        script = scripts.PUBLISH
        calls: list[Publication | None] = []
        packed: list[bytes] = []  # one packed command each
        if mixed is None:
            history = batch[0].history
            mixed = any(item.history != history for item in batch)
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
        return calls, packed, mixed, waits, epoch

    async def _pipeline(
        self, batch: list[PendingPublication], flight: _Flight | None = None
    ) -> list[Any]:
        """Publish ``batch`` in one round trip on the publications' connection; a
        result (position or None) or the error per publication. With ``flight``, the
        batch was sent already (:meth:`_send_directly`) and its replies are in.

        The connection is driven directly (the commands packed here, the replies read
        in order), without a client, a pool or a pipeline object; its caller sets the
        deadline."""
        script = scripts.PUBLISH
        if flight is None:
            calls, packed, mixed, waits, epoch = self._pack(batch)
            if self._publisher is None:
                conn = self._new_publish_connection()
                self._publisher = (conn, await connected_reply_reader(conn))
            reader = self._publisher[1]
            waiter = reader.expect(len(packed))  # each command's error is its reply
            reader.write(b"".join(packed))
            self._batch_sent = True
            replies = await waiter
        else:
            calls, mixed, waits, epoch = flight.calls, False, False, flight.epoch
            if isinstance(flight.replies, BaseException):
                raise flight.replies  # the connection's error, as the waiter's
            assert flight.replies is not None, "settled before its replies arrived"
            replies = flight.replies
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
