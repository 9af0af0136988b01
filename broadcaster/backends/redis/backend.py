"""The Redis backend: many nodes (processes, hosts) share publications through Redis.

One class on every topology: the URL's scheme picks a shard provider
(:mod:`broadcaster.backends.redis.topology`) that says where the primary is (a
standalone Redis, the one Sentinel names); Redis Cluster adds sharded pub/sub
(:mod:`broadcaster.backends.redis.cluster`). Key layout: :mod:`.layout` (one for every
topology); payload: :mod:`.codec`; scripts: :mod:`.scripts`; raw RESP: :mod:`.resp`;
what agent processes call: :mod:`.publish`.

One publication is one Lua script (:data:`broadcaster.backends.redis.scripts.PUBLISH`):
epoch, offset, stream entry and ``PUBLISH`` happen together, so the delivered position
and the stored one cannot disagree and delivery order is offset order. The backend sends
its publications in batches on a connection of their own (:meth:`RedisBackend.publish`).

Each node ``SUBSCRIBE``\\ s only to the channels its clients use, on one pub/sub
connection (no socket timeout: a heartbeat ``PING`` checks it) read by one task that
decodes each message once and calls the handler. When Redis is lost the node stays up,
:attr:`RedisBackend.ready` turns False, and a background task reconnects with capped,
jittered exponential backoff, subscribes again to every channel it had and rewrites this
node's presence entries and subscription counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import secrets
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import (
    AuthenticationError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from broadcaster.backends.base import (
    DEFAULT_HISTORY_META_TTL,
    DEFAULT_HISTORY_SIZE,
    DEFAULT_HISTORY_TTL,
    BackendUnavailable,
    ControlHandler,
    EncodedHandler,
    HistoryResult,
    NotReplicated,
    PresenceFull,
    PresenceMember,
    PublicationHandler,
    PublishUnconfirmed,
    check_history_options,
    new_epoch,
)
from broadcaster.backends.redis import scripts
from broadcaster.backends.redis.codec import (
    decode_publication,
    encode_publication,
    ms,
    position_of,
    split_payload,
    text,
)
from broadcaster.backends.redis.layout import (
    DEFAULT_PREFIX,
    app_key,
    channel_key,
    claim_key,
    control_channel,
    nodes_key,
    probe_key,
    publication_channel,
    value_key,
)
from broadcaster.backends.redis.publish import (
    check_wait,
    claim_via_redis,
    publish_script_args,
    release_via_redis,
    store_value_via_redis,
)
from broadcaster.backends.redis.resp import (
    PubSubReader,
    ReplyReader,
    pack_commands,
    round_trip,
    take_over,
)
from broadcaster.backends.redis.topology import topology_for
from broadcaster.publication import Position, Publication

__all__ = ["DEFAULT_PREFIX", "RedisBackend"]

log = logging.getLogger(__name__)

ERRORS = (RedisError, OSError)
"""Errors of a command to Redis."""
_ERRORS = ERRORS
_PROBE_INTERVAL = 1.0  # seconds between readiness PINGs (at once after a failed command)
# Failures that mean Redis did not answer (rather than refused a command).
_UNANSWERED = (RedisTimeoutError, RedisConnectionError, OSError)
# Error replies that say this Redis takes no writes now, whatever the command: a replica
# (demoted primary, or the URL names one), out of memory, a failed snapshot with
# stop-writes-on-bgsave-error, loading its data set, min-replicas-to-write unmet, a
# cluster without all its slots. The node is not ready until a write goes through.
_REFUSALS = frozenset(
    ("READONLY", "OOM", "MISCONF", "LOADING", "MASTERDOWN", "NOREPLICAS", "CLUSTERDOWN")
)
_PROBE_TTL_MS = 10_000  # the write-probe key's lifetime


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A publication waiting for this tick's pipeline, and its caller's future."""

    publication: Publication
    history: bool
    done: asyncio.Future[Position | None]


_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


# -- the backend ------------------------------------------------------------------------


class RedisBackend:
    """A :class:`~broadcaster.backends.base.Backend` shared by every node using the same
    Redis and ``prefix``.

    Args:
        url: ``redis://[user:password@]host:port/db`` (or ``rediss://``, ``unix://``).
        prefix: namespace of every key and pub/sub channel of this deployment.
        apps: ids of the apps whose control messages this node receives.
        history_size: publications kept per channel (approximately trimmed in Redis,
            exactly enforced on read).
        history_ttl: seconds the history lives after the channel's last publication.
        history_meta_ttl: seconds the channel's epoch and offset live after its last
            publication.
        node_id: this node's id (letters, digits, ``_.-``); random by default.
        node_ttl: seconds after its last heartbeat when a node counts as dead: its
            presence entries and subscription counts are then ignored and deleted.
        heartbeat_interval: seconds between heartbeats (default ``node_ttl / 3``).
        command_timeout: seconds a command may take before it fails.
        connect_timeout: seconds a connection attempt may take.
        reconnect_min: first delay before reconnecting; doubled per failure...
        reconnect_max: ...up to this many seconds (each delay jittered by up to -50%).
        read_delay: seconds the pub/sub connection is not read after each wake-up, so
            that what arrives meanwhile is delivered in one pass (see
            :class:`PubSubReader`); 0 reads at once.
        wait_replicas: the durable mode: a publication with history is acknowledged
            only once Redis ``WAIT`` confirms that this many replicas have it, and is
            refused (:class:`~broadcaster.backends.base.NotReplicated`) otherwise;
            0 (the default) acknowledges what the primary took.
        wait_timeout: seconds ``WAIT`` may wait for the replicas.

    Raises:
        ValueError: for an invalid URL or option, naming it.
    """

    # A channel's pub/sub commands (Redis Cluster: the sharded ones).
    _SUBSCRIBE: ClassVar[bytes] = b"subscribe"
    _UNSUBSCRIBE: ClassVar[bytes] = b"unsubscribe"
    _sharded: ClassVar[bool] = False
    """Sharded pub/sub (``SPUBLISH``/``SSUBSCRIBE``): Redis Cluster."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        apps: Sequence[str] = (),
        history_size: int = DEFAULT_HISTORY_SIZE,
        history_ttl: float = DEFAULT_HISTORY_TTL,
        history_meta_ttl: float = DEFAULT_HISTORY_META_TTL,
        node_id: str | None = None,
        node_ttl: float = 30.0,
        heartbeat_interval: float | None = None,
        command_timeout: float = 2.0,
        connect_timeout: float = 2.0,
        reconnect_min: float = 0.1,
        reconnect_max: float = 10.0,
        read_delay: float = 0.0,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
    ) -> None:
        check_history_options(history_size, history_ttl, history_meta_ttl)
        if not 0 <= read_delay <= 1:
            raise ValueError(f"read_delay must be 0-1 seconds, not {read_delay!r}")
        check_wait(wait_replicas, wait_timeout)
        _check_options(prefix, node_id, node_ttl, heartbeat_interval, reconnect_min, reconnect_max)
        self._topology = topology_for(
            url, command_timeout=command_timeout, connect_timeout=connect_timeout
        )
        self.url = self._topology.url
        self.prefix = prefix
        self.apps = tuple(apps)
        self.history_size = history_size
        self.history_ttl = history_ttl
        self.history_meta_ttl = history_meta_ttl
        self.node_ttl = node_ttl
        self.heartbeat_interval = heartbeat_interval or node_ttl / 3
        self.command_timeout = command_timeout
        self.connect_timeout = connect_timeout
        self.reconnect_min = reconnect_min
        self.reconnect_max = reconnect_max
        self.read_delay = read_delay
        self.wait_replicas = wait_replicas
        self.wait_timeout = wait_timeout
        self.reconnects = 0
        """Times the connection to Redis was lost and established again."""
        self.breaks = 0
        """Times the node stopped reading a server that may still take publications
        (see :attr:`broadcaster.backends.base.Broker.breaks`)."""
        self._node_id = node_id or secrets.token_hex(8)
        self._nodes_key = nodes_key(prefix)
        self._client: Redis = self._topology.client
        self._prober: Redis = self._topology.prober
        self._responsive = True  # False from a failed command until a PING answers
        self._refusing: str | None = None  # an error reply refusing writes, until one passes
        self._retry_now = asyncio.Event()  # cuts a reconnection's back-off short
        # Subscribe passes (a connection, or a cluster resync), numbered when they take
        # their list of channels, and the subscribes that wait for a pass after theirs.
        self._passes = 0
        self._pass_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._suspect = asyncio.Event()
        self._ready = False
        self._stopped = True
        self._ever_connected = False
        self._on_publication: PublicationHandler | None = None
        self._on_control: ControlHandler | None = None
        self._on_encoded: EncodedHandler | None = None
        self._pubsub: AbstractConnection | None = None
        self._reader: PubSubReader | None = None  # reads ``_pubsub``
        self._pong_at = 0.0
        self._pong_waiter: asyncio.Future[None] | None = None
        self._channels: set[bytes] = set()
        self._waiters: dict[tuple[bytes, bytes], deque[asyncio.Future[None]]] = {}
        # (UN)SUBSCRIBE commands of this tick, not sent yet, and their callers' futures.
        self._pubsub_outbox: list[tuple[bytes, bytes, asyncio.Future[None]]] = []
        self._presence: dict[str, dict[str, bytes]] = {}
        self._presence_dirty: set[str] = set()
        self._counts: dict[str, dict[str, int]] = {}
        self._counts_dirty = False
        self._counts_pending: set[tuple[str, str]] = set()  # to write in this tick's batch
        self._counts_written: asyncio.Future[None] | None = None  # ...when it is written
        self._counts_writer: asyncio.Task[None] | None = None  # the write in flight
        self._connections: dict[str, int] = {}  # app -> connections counted in Redis
        self._admitting: dict[str, int] = {}  # app -> admissions sent, not answered yet
        self._connections_dirty: set[str] = set()  # apps whose count Redis may have wrong
        self._tasks: list[asyncio.Task[None]] = []
        self._outbox: list[Outgoing] = []  # publications of this tick, not sent yet
        self._sending: set[asyncio.Task[None]] = set()
        self._publishing = False  # a batch is in flight; the outbox waits for it
        # The batch in flight is cancelled past its deadline by one timer, re-armed only
        # when it fires (asyncio.timeout would arm and disarm a timer for every batch).
        self._batch_deadline: float | None = None
        self._batch_expired = False
        self._batch_sent = False  # the batch in flight was written to Redis
        self._watchdog: asyncio.TimerHandle | None = None
        # The publications' own connection (no socket timeout: one deadline per batch).
        self._publisher: tuple[AbstractConnection, ReplyReader] | None = None

    @property
    def node_id(self) -> str:
        return self._node_id

    @property
    def ready(self) -> bool:
        """True while connected, answering and taking writes: a command that failed for
        want of an answer (timeout, lost connection) makes it False at once, until a PING
        on a connection of its own answers again; an error reply refusing writes
        (``READONLY``, ``OOM``, ``MISCONF``...) makes it False until a write on that
        connection goes through (both probed every second: a PING and a write of a
        short-lived key, so a refusal is seen even by a node that writes nothing)."""
        return self._ready and self._responsive and self._refusing is None

    @property
    def problem(self) -> str | None:
        """See :meth:`broadcaster.backends.base.Broker.problem`."""
        if self._stopped:
            return "stopped"
        if not (self._ready and self._responsive):
            return "disconnected"
        if self._refusing is not None:
            return f"refuses writes ({self._refusing})"
        return None

    # -- lifecycle ------------------------------------------------------------------------

    async def start(
        self,
        on_publication: PublicationHandler,
        on_control: ControlHandler,
        on_encoded: EncodedHandler | None = None,
    ) -> None:
        """Connect and start delivering. If Redis cannot be reached, return anyway (not
        ready) and keep reconnecting in the background. Publications go to
        ``on_encoded`` undecoded when it is given.

        Raises:
            BackendUnavailable: Redis refused the credentials or the connection setup.
        """
        self._on_publication = on_publication
        self._on_control = on_control
        self._on_encoded = on_encoded
        self._stopped = False
        if not self.apps:
            log.warning("no apps given to the Redis backend: control messages won't arrive")
        try:
            await self._connect()
        except (AuthenticationError, ResponseError) as exc:
            await self.stop()
            raise BackendUnavailable(f"Redis at {self.url} refused this node: {exc}") from None
        except _ERRORS as exc:
            log.warning(
                "Redis at %s is unreachable (%s); retrying in the background", self.url, exc
            )
        self._tasks = [
            asyncio.create_task(self._supervise(), name="redis-backend-reader"),
            asyncio.create_task(self._heartbeat_forever(), name="redis-backend-heartbeat"),
            asyncio.create_task(self._probe_forever(), name="redis-backend-probe"),
        ]
        if self._topology.locates and not self._stopped:
            stopped = lambda: self._stopped  # noqa: E731
            watch = self._topology.watch(self._switched, stopped)
            self._tasks.append(asyncio.create_task(watch, name="redis-backend-primary-watch"))

    async def stop(self) -> None:
        """Stop the tasks, withdraw this node's heartbeat and counts, and disconnect;
        idempotent."""
        if self._stopped and not self._tasks:
            return
        self._stopped = True
        self._ready = False
        for task in self._tasks:
            task.cancel()
        # Bounded: a task whose cancellation was swallowed still ends by itself (its loop
        # checks _stopped), and stop() must not wait for it for ever meanwhile.
        pending: set[asyncio.Task[None]] = set()
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=self.command_timeout + 1)
        for task in pending:
            log.warning("task %s did not stop when cancelled", task.get_name())
        self._tasks = []
        while self._sending:  # publications already accepted still go out
            await asyncio.gather(*self._sending, return_exceptions=True)
        await self._drop_publisher()
        with contextlib.suppress(*_ERRORS):
            await self._withdraw()
        self._channels.clear()
        self._presence.clear()
        self._presence_dirty.clear()
        self._counts.clear()
        self._connections.clear()
        await self._drop_pubsub()
        await self._close_clients()
        log.info("Redis backend of node %s stopped", self._node_id)

    # -- pub/sub --------------------------------------------------------------------------

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
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Position | None] = loop.create_future()
        try:
            self._check_ready()
        except BackendUnavailable as exc:
            done.set_exception(exc)
            return done
        self._outbox.append(Outgoing(publication, history, done))
        if len(self._outbox) == 1 and not self._publishing:
            loop.call_soon(self._send_outbox)
        return done

    def _send_outbox(self) -> None:
        if self._publishing or not self._outbox:
            return  # the batch in flight sends the rest when it is answered
        batch, self._outbox = self._outbox, []
        self._publishing = True
        task = asyncio.get_running_loop().create_task(self._publish_batch(batch))
        self._sending.add(task)
        task.add_done_callback(self._batch_done)

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        self._sending.discard(task)
        self._publishing = False
        self._send_outbox()

    async def _publish_batch(self, batch: list[Outgoing]) -> None:
        loop = asyncio.get_running_loop()
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
                replica = replica or (_refusal(result) or "").startswith("READONLY")
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

    async def _pipeline(self, batch: list[Outgoing]) -> list[Any]:
        """Publish ``batch`` in one round trip on the publications' connection; a
        result (position or None) or the error per publication.

        The connection is driven directly (the commands packed here, the replies read
        in order), without a client, a pool or a pipeline object; its caller sets the
        deadline."""
        script = scripts.PUBLISH
        calls: list[tuple[tuple[str, str], tuple[str | int | bytes, ...]] | None] = []
        commands: list[tuple[str | int | bytes, ...]] = []
        mixed = len({item.history for item in batch}) > 1
        if mixed:
            # A Redis without the script would run the plain PUBLISHes at once and
            # the scripted ones only when sent again: load it first to keep order.
            commands.append(("SCRIPT", "LOAD", script.source))
        # One epoch for the batch (a random draw is a system call): it only serves a
        # channel that the batch creates, and a batch creates a channel once.
        epoch = new_epoch()
        for item in batch:
            p = item.publication
            if item.history:
                keys, args = publish_script_args(
                    self.prefix,
                    p,
                    self.history_size,
                    self.history_ttl,
                    self.history_meta_ttl,
                    epoch,
                    sharded=self._sharded,
                )
                calls.append((keys, args))
                commands.append(("EVALSHA", script.sha, len(keys), *keys, *args))
            else:
                calls.append(None)
                name = publication_channel(self.prefix, p.app_id, p.channel)
                commands.append(("PUBLISH", name, encode_publication(p)))
        # The durable mode: WAIT on this connection confirms the writes sent before it.
        waits = bool(self.wait_replicas) and any(call is not None for call in calls)
        if waits:
            commands.append(("WAIT", self.wait_replicas, ms(self.wait_timeout)))
        if self._publisher is None:
            conn = self._new_publish_connection()
            try:
                await conn.connect()  # type: ignore[no-untyped-call]
                reader = ReplyReader()
                take_over(conn, reader)
            except BaseException:
                await conn.disconnect(nowait=True)
                raise
            self._publisher = (conn, reader)
        reader = self._publisher[1]
        waiter = reader.expect(len(commands))  # each command's error is its reply
        reader.write(pack_commands(commands))
        self._batch_sent = True
        replies = await waiter
        if mixed:
            replies = replies[1:]
        kept = replies.pop() if waits else None
        results: list[Any] = []
        for call, reply in zip(calls, replies, strict=True):
            if call is not None and isinstance(reply, NoScriptError):  # a restarted Redis
                try:
                    reply = await self._eval(script, call, waits)
                except _ERRORS as exc:
                    reply = exc
            if isinstance(reply, BaseException) or call is None:
                results.append(reply if isinstance(reply, BaseException) else None)
            else:
                results.append(position_of(reply))
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

    async def store_value(self, app_id: str, key: str, value: bytes, ttl: float) -> None:
        """See :meth:`broadcaster.backends.base.Backend.store_value`."""
        self._check_ready()
        try:
            await store_value_via_redis(self._client, self.prefix, app_id, key, value, ttl)
        except _ERRORS as exc:
            raise self._failed("store a value", exc) from exc

    async def load_value(self, app_id: str, key: str) -> bytes | None:
        """See :meth:`broadcaster.backends.base.Backend.load_value`."""
        self._check_ready()
        try:
            value = await self._client.get(value_key(self.prefix, app_id, key))
        except _ERRORS as exc:
            raise self._failed("load a value", exc) from exc
        return value.encode() if isinstance(value, str) else value

    async def send_control(self, app_id: str, message: Mapping[str, Any]) -> None:
        """Publish a control message to every node that lists ``app_id`` in ``apps``.

        Raises:
            BackendUnavailable: Redis is unreachable.
        """
        self._check_ready()
        payload = orjson.dumps({"app": app_id, "message": message})
        try:
            channel = self._control_channel(app_id)
            await self._client.execute_command(self._publish_command, channel, payload)  # type: ignore[no-untyped-call]
        except _ERRORS as exc:
            raise self._failed("send a control message", exc) from exc

    # -- history --------------------------------------------------------------------------

    async def history(
        self, app_id: str, channel: str, since: Position, limit: int | None = None
    ) -> HistoryResult:
        """See :meth:`broadcaster.backends.base.Backend.history` (reads only)."""
        args = (since.offset, since.epoch, self.history_size, limit or 0)
        reply = await self._run(scripts.HISTORY, app_id, channel, args, "read the history")
        epoch = text(reply[0])
        position = Position(int(reply[1]), epoch) if epoch else None
        if not reply[2]:
            return HistoryResult((), recovered=False, position=position)
        publications = tuple(map(decode_publication, reply[3:]))
        return HistoryResult(publications, recovered=True, position=position)

    async def latest(self, app_id: str, channel: str) -> Position | None:
        """See :meth:`broadcaster.backends.base.Backend.latest` (reads only)."""
        self._check_ready()
        try:
            epoch, offset = await self._client.hmget(
                self._channel_key(app_id, channel, "meta"), "e", "o"
            )
        except _ERRORS as exc:
            raise self._failed("read a channel's position", exc) from exc
        if epoch is None:
            return None
        return Position(int(offset or 0), text(epoch))

    async def position(self, app_id: str, channel: str) -> Position:
        args = (ms(self.history_meta_ttl), new_epoch())
        reply = await self._run(scripts.POSITION, app_id, channel, args, "read a position")
        return Position(int(reply[1]), text(reply[0]))

    async def _run(
        self,
        script: scripts.Script,
        app_id: str,
        channel: str,
        args: tuple[str | int, ...],
        action: str,
    ) -> list[Any]:
        """Run a script on the channel's meta and stream keys."""
        self._check_ready()
        keys = (
            self._channel_key(app_id, channel, "meta"),
            self._channel_key(app_id, channel, "stream"),
        )
        try:
            reply: list[Any] = await script.run(self._client, keys, args)
        except _ERRORS as exc:
            raise self._failed(action, exc) from exc
        return reply

    # -- presence -------------------------------------------------------------------------

    async def presence_add(
        self,
        app_id: str,
        channel: str,
        socket_id: str,
        member: PresenceMember,
        limit: int | None = None,
    ) -> bool:
        """See :meth:`broadcaster.backends.base.Backend.presence_add`.

        Raises:
            BackendUnavailable: Redis is unreachable; nothing was recorded.
            PresenceFull: over ``limit`` (checked in the same script as the addition).
            ValueError: ``member.user_info`` is not JSON-serialisable.
        """
        self._check_ready()
        key = self._channel_key(app_id, channel, "presence")
        entry = self._entry(member)
        self._presence.setdefault(key, {})[socket_id] = entry
        args = (socket_id, entry, member.user_id, await self._liveness())
        try:
            added = await scripts.PRESENCE_ADD.run(
                self._client,
                (key,),
                (*args, ms(self.node_ttl), self._node_id, limit or 0),
            )
        except _ERRORS as exc:
            self._forget_local(key, socket_id)
            self._presence_dirty.add(key)
            raise self._failed("record a presence member", exc) from exc
        if added == -1:
            self._forget_local(key, socket_id)
            raise PresenceFull(limit or 0)
        return bool(added)

    async def presence_remove(
        self, app_id: str, channel: str, socket_id: str
    ) -> PresenceMember | None:
        """See :meth:`broadcaster.backends.base.Backend.presence_remove`.

        Raises:
            BackendUnavailable: Redis is unreachable; the connection is forgotten here
                and removed from Redis on reconnection, but no ``member_removed`` can
                be decided now.
        """
        key = self._channel_key(app_id, channel, "presence")
        entry = self._forget_local(key, socket_id)
        if entry is None:
            return None
        member = self._member(entry)
        try:
            self._check_ready()
            alive = await self._liveness()
            last = await scripts.PRESENCE_REMOVE.run(
                self._client, (key,), (socket_id, entry, alive, self._node_id)
            )
        except (BackendUnavailable, *_ERRORS) as exc:
            self._presence_dirty.add(key)
            if isinstance(exc, BackendUnavailable):
                raise
            raise self._failed("remove a presence member", exc) from exc
        return member if last else None

    async def presence_members(self, app_id: str, channel: str) -> list[PresenceMember]:
        """Unique members (by user id) across live nodes.

        Raises:
            BackendUnavailable: Redis is unreachable.
        """
        self._check_ready()
        key = self._channel_key(app_id, channel, "presence")
        try:
            alive = await self._liveness()
            entries = await scripts.PRESENCE_MEMBERS.run(self._client, (key,), (alive,))
        except _ERRORS as exc:
            raise self._failed("read presence members", exc) from exc
        unique: dict[str, PresenceMember] = {}
        for entry in entries:
            member = self._member(entry)
            unique.setdefault(member.user_id, member)
        return list(unique.values())

    def _entry(self, member: PresenceMember) -> bytes:
        try:
            return orjson.dumps({"n": self._node_id, "u": member.user_id, "i": member.user_info})
        except TypeError as exc:
            raise ValueError(f"user_info of {member.user_id!r} is not JSON: {exc}") from None

    @staticmethod
    def _member(entry: bytes) -> PresenceMember:
        data = orjson.loads(entry)
        return PresenceMember(data["u"], data["i"])

    def _forget_local(self, key: str, socket_id: str) -> bytes | None:
        local = self._presence.get(key)
        if local is None:
            return None
        entry = local.pop(socket_id, None)
        if not local:
            del self._presence[key]
        return entry

    # -- subscription counts --------------------------------------------------------------

    async def add_subscriptions(self, app_id: str, channel: str, delta: int) -> None:
        """Adjust this node's count. Never fails: while Redis is unreachable the count is
        kept here and written on reconnection."""
        counts = self._counts.setdefault(app_id, {})
        count = counts.get(channel, 0) + delta
        if count > 0:
            counts[channel] = count
        else:
            counts.pop(channel, None)
        if not self._ready:
            self._counts_dirty = True
            return
        # The counts changed in one tick (a reconnect storm: thousands) are written in
        # one pipeline, one write in flight at a time so the values arrive in order.
        written = self._counts_written
        if not self._counts_pending or written is None:
            loop = asyncio.get_running_loop()
            written = self._counts_written = loop.create_future()
            if self._counts_writer is None:
                loop.call_soon(self._write_counts_soon)
        self._counts_pending.add((app_id, channel))
        await asyncio.shield(written)

    def _write_counts_soon(self) -> None:
        if self._counts_writer is None and self._counts_pending:
            task = asyncio.get_running_loop().create_task(self._write_counts())
            self._counts_writer = task
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _write_counts(self) -> None:
        """Write this node's count of every pending (app, channel); never fails (a
        failed write is retried by the heartbeat)."""
        pending, self._counts_pending = self._counts_pending, set()
        written = self._counts_written
        assert written is not None
        try:
            if self._ready:
                by_app: dict[str, list[str]] = {}
                for app_id, channel in pending:
                    by_app.setdefault(app_id, []).append(channel)
                pipe = self._client.pipeline(transaction=False)
                for app_id, channels in by_app.items():  # one HSET, one HDEL per app
                    key = self._app_key(app_id, "subs", self._node_id)
                    counts = self._counts.get(app_id, {})
                    kept = {c: counts[c] for c in channels if c in counts}
                    if kept:
                        pipe.hset(key, mapping=kept)  # type: ignore[arg-type]
                    if len(kept) < len(channels):
                        pipe.hdel(key, *(c for c in channels if c not in counts))
                    self._refresh_counts(pipe, app_id)
                await pipe.execute()
            else:
                self._counts_dirty = True
        except _ERRORS as exc:
            self._counts_dirty = True
            log.debug("subscription counts not written (%s); retried by the heartbeat", exc)
        finally:
            if not written.done():
                written.set_result(None)
            self._counts_writer = None
            self._write_counts_soon()  # what changed during this write

    async def subscription_counts(
        self, app_id: str, channels: Collection[str] | None = None
    ) -> dict[str, int]:
        """Raises:
        BackendUnavailable: Redis is unreachable."""
        self._check_ready()
        if channels is not None and not channels:
            return {}
        keys = (self._app_key(app_id, "subs-nodes"),)
        try:
            args = (self._app_key(app_id, "subs", ""), await self._liveness(), *(channels or ()))
            flat = await scripts.SUBSCRIPTION_COUNTS.run(self._client, keys, args)
        except _ERRORS as exc:
            raise self._failed("read subscription counts", exc) from exc
        return {text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}

    def _refresh_counts(self, pipe: Any, app_id: str) -> None:
        ttl = ms(self.node_ttl)
        pipe.pexpire(self._app_key(app_id, "subs", self._node_id), ttl)
        pipe.sadd(self._app_key(app_id, "subs-nodes"), self._node_id)
        pipe.pexpire(self._app_key(app_id, "subs-nodes"), ttl)

    # -- internals: names and errors ------------------------------------------------------

    def _channel_key(self, app_id: str, channel: str, kind: str) -> str:
        return channel_key(self.prefix, app_id, channel, kind)

    def _app_key(self, app_id: str, kind: str, name: str | None = None) -> str:
        return app_key(self.prefix, app_id, kind, name)

    def _control_channel(self, app_id: str) -> str:
        """The pub/sub channel of ``app_id``'s control messages."""
        return control_channel(self.prefix, app_id)

    @property
    def _publish_command(self) -> str:
        return "SPUBLISH" if self._sharded else "PUBLISH"

    async def _close_clients(self) -> None:
        await self._topology.close()

    async def _liveness(self) -> str:
        """The live nodes (``,id,id,``), which the presence and count scripts take: a
        script may not read the nodes' sorted set, in a slot of its own."""
        live = await scripts.LIVE.run(self._client, (self._nodes_key,), ())
        ids = {text(node) for node in live} | {self._node_id}
        return "," + ",".join(sorted(ids)) + ","

    async def _beat(self) -> bool:
        """Refresh this node's heartbeat deadline; True when it was still alive."""
        args = (self._node_id, ms(self.node_ttl))
        return bool(await scripts.BEAT.run(self._client, (self._nodes_key,), args))

    def _check_ready(self) -> None:
        if self._stopped:
            raise BackendUnavailable("the Redis backend is stopped (or not started yet)")
        if not self._ready:
            raise BackendUnavailable(
                f"Redis at {self.url} is unreachable; the node is reconnecting, retry later"
            )

    def _failed(self, action: str, exc: BaseException, *, sent: bool = False) -> BackendUnavailable:
        """The error to raise for ``exc``; ``sent``: the command went out, so one that
        got no answer (a timeout, a lost connection) may have taken effect."""
        if isinstance(exc, _UNANSWERED):
            self._unanswered()
            if sent:
                return PublishUnconfirmed(
                    f"Redis at {self.url} did not confirm the {action} ({exc}): it may or "
                    "may not have gone out"
                )
        elif (refusal := _refusal(exc)) is not None:
            self._refused(refusal)
        return BackendUnavailable(f"could not {action} through Redis at {self.url}: {exc}")

    def _refused(self, refusal: str) -> None:
        """An error reply refusing writes (``refusal``, from :func:`_refusal`): not ready
        until a write passes (probed now)."""
        if self._refusing is None:
            log.warning("Redis at %s refuses writes (%s); not ready", self.url, refusal)
        self._refusing = refusal
        self._suspect.set()

    def _unanswered(self) -> None:
        """A command got no answer: not ready until a PING answers (probed now)."""
        if self._responsive and self._ready:
            log.warning("Redis at %s did not answer a command; not ready", self.url)
        self._responsive = False
        self._suspect.set()

    async def _probe_forever(self) -> None:
        # Every task loop of the backend also checks _stopped: on Python 3.11 a
        # cancellation that lands as an asyncio.timeout expires can be swallowed (turned
        # into TimeoutError), and stop() would then wait for the task for ever.
        while not self._stopped:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_PROBE_INTERVAL):
                    await self._suspect.wait()
            self._suspect.clear()
            if self._ready:
                await self._probe()

    async def _probe(self) -> None:
        try:
            async with asyncio.timeout(self.command_timeout):
                await self._prober.ping()
                # Every time, not only once refusing: a Redis out of memory answers
                # PINGs and reads, and a node that publishes nothing itself (agents
                # publish straight to Redis) would otherwise learn of it only from its
                # heartbeat, a third of node_ttl later.
                key = probe_key(self.prefix, self._node_id)
                await self._prober.set(key, b"1", px=_PROBE_TTL_MS)
        except ResponseError as exc:
            refusal = _refusal(exc)
            if refusal is not None:
                self._responsive = True  # it answered, and still refuses writes
                self._refusing = refusal
                return
            log.debug("Redis at %s: the write probe failed (%s)", self.url, exc)
        except (TimeoutError, *_ERRORS) as exc:
            if self._responsive:
                log.warning("Redis at %s did not answer a PING (%s); not ready", self.url, exc)
            self._responsive = False
            return
        if not self._responsive or self._refusing is not None:
            log.info("Redis at %s answers and takes writes again; ready", self.url)
        self._responsive = True
        self._refusing = None

    # -- internals: connection ------------------------------------------------------------

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
            reader = PubSubReader(self._dispatch, self.read_delay)
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

    def _message(self, data: bytes) -> None:
        """Deliver one pub/sub message: a publication (format 2, or 1 from an older
        publisher) or a control message (a JSON object)."""
        first = data[:1]
        if first == b"{":
            self._control(data)
            return
        on_encoded = self._on_encoded
        encoded = first == b"2" and on_encoded is not None  # the hot path: no JSON at all
        try:
            if encoded:
                parts = split_payload(data)
            else:
                publication = decode_publication(data)
        except ValueError:
            log.warning("dropped a malformed publication: %r", data[:200])
            return
        try:
            if encoded:
                on_encoded(*parts)  # type: ignore[misc]
            else:
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

    def _confirm(self, kind: bytes, name: bytes) -> None:
        waiters = self._waiters.get((kind, name))
        if waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    # -- internals: heartbeat and node state ----------------------------------------------

    async def _heartbeat_forever(self) -> None:
        while not self._stopped:
            await asyncio.sleep(self.heartbeat_interval)
            if not self._ready:
                continue
            try:
                await self._heartbeat()
            except _ERRORS as exc:
                log.debug("heartbeat failed (%s)", exc)
                if (refusal := _refusal(exc)) is not None:
                    self._refused(refusal)

    async def _heartbeat(self) -> None:
        if await self._ping_pubsub():
            await self._beat_state()

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

    async def _beat_state(self) -> None:
        """Refresh this node's heartbeat, counts and presence entries (all of them when
        Redis lost some)."""
        ttl = ms(self.node_ttl)
        was_alive = await self._beat()
        if not was_alive or self._counts_dirty or self._presence_dirty:
            if not was_alive:
                log.warning("node %s was considered dead; restoring its state", self._node_id)
            await self._restore()
            return
        pipe = self._client.pipeline(transaction=False)
        for app_id in self._counts:
            self._refresh_counts(pipe, app_id)
        for key in self._presence:
            pipe.pexpire(key, ttl)
        await pipe.execute()
        await self._beat_connections()

    async def _restore(self) -> None:
        """Write this node's heartbeat, subscription counts and presence entries (after a
        reconnection, or when another node took this one for dead)."""
        ttl = ms(self.node_ttl)
        await self._beat()
        pipe = self._client.pipeline(transaction=False)
        for app_id, counts in self._counts.items():
            key = self._app_key(app_id, "subs", self._node_id)
            pipe.delete(key)
            if counts:
                pipe.hset(key, mapping=counts)  # type: ignore[arg-type]
            self._refresh_counts(pipe, app_id)
        await pipe.execute()
        self._counts_dirty = False
        for key in self._presence_dirty | set(self._presence):
            pairs = [item for pair in self._presence.get(key, {}).items() for item in pair]
            await scripts.PRESENCE_RESTORE.run(self._client, (key,), (self._node_id, ttl, *pairs))
            self._presence_dirty.discard(key)
        await self._beat_connections(force=True)

    async def _withdraw(self) -> None:
        """On stop: this node's counts and presence entries disappear at once."""
        pipe = self._client.pipeline(transaction=False)
        pipe.zrem(self._nodes_key, self._node_id)
        for app_id in self._counts:
            pipe.delete(self._app_key(app_id, "subs", self._node_id))
        for key, local in self._presence.items():
            if local:
                pipe.hdel(key, *local)
        self._withdraw_connections(pipe)
        async with asyncio.timeout(self.command_timeout):
            await pipe.execute()

    # -- connection counts (apps with max_connections) ------------------------------------

    counts_across_nodes = True
    """Every node's connections count: see :meth:`admit_connection`."""

    async def admit_connection(self, app_id: str, limit: int) -> bool:
        """See :meth:`broadcaster.backends.base.Backend.admit_connection`: one script
        (:data:`broadcaster.backends.scripts.CONNECTION_ADMIT`) on the app's two keys, which
        also forgets the counts of nodes whose heartbeat deadline passed.

        Raises:
            BackendUnavailable: Redis is unreachable or did not answer; nothing was
                counted (if the count went through unanswered, the next heartbeat
                writes this node's true count).
        """
        self._check_ready()
        if not self._responsive:  # a command just went unanswered: fail fast, not late
            raise BackendUnavailable(f"Redis at {self.url} does not answer; retry later")
        counted = self._connections.get(app_id, 0)
        args = (self._node_id, ms(self.node_ttl), limit, counted)
        self._admitting[app_id] = self._admitting.get(app_id, 0) + 1
        try:
            keys = self._connection_keys(app_id)
            admitted = await scripts.CONNECTION_ADMIT.run(self._client, keys, args)
        except _ERRORS as exc:
            self._connections_dirty.add(app_id)
            raise self._failed("count a connection", exc) from exc
        finally:
            self._admitting[app_id] -= 1
        if not admitted:
            return False
        self._connections[app_id] = self._connections.get(app_id, 0) + 1
        return True

    async def release_connection(self, app_id: str) -> None:
        """See :meth:`broadcaster.backends.base.Backend.release_connection`."""
        try:
            if not self.ready:
                raise BackendUnavailable("not connected, or not answering")
            await scripts.CONNECTION_RELEASE.run(
                self._client, self._connection_keys(app_id), (self._node_id,)
            )
        except (BackendUnavailable, *_ERRORS) as exc:
            self._connections_dirty.add(app_id)  # the heartbeat writes the true count
            log.debug("connection count of app %s not lowered (%s)", app_id, exc)
        finally:
            # Lowered only once Redis has (or could not): a heartbeat meanwhile writes
            # a count too high rather than too low.
            self._connections[app_id] = self._connections.get(app_id, 1) - 1

    async def _beat_connections(self, *, force: bool = False) -> None:
        """Refresh this node's deadline in the connection counts of every app it has
        counted connections of; write its count where Redis lost it (or everywhere with
        ``force``). Admissions still unanswered are included: a count written while
        commands are in flight errs on the high side."""
        ttl = ms(self.node_ttl)
        for app_id in set(self._connections) | self._connections_dirty:
            count = self._connections.get(app_id, 0) + self._admitting.get(app_id, 0)
            write = force or app_id in self._connections_dirty
            args = (self._node_id, ttl, count, 1 if write else 0)
            await scripts.CONNECTION_BEAT.run(self._client, self._connection_keys(app_id), args)
            self._connections_dirty.discard(app_id)
            self._connections.setdefault(app_id, 0)  # kept (one per app) even at zero

    def _withdraw_connections(self, pipe: Any) -> None:
        for app_id in self._connections:
            keys = self._connection_keys(app_id)
            pipe.hdel(keys[0], self._node_id)
            pipe.zrem(keys[1], self._node_id)

    def _connection_keys(self, app_id: str) -> tuple[str, str]:
        return (self._app_key(app_id, "conn-counts"), self._app_key(app_id, "conn-nodes"))

    # -- claims (leases) ------------------------------------------------------------------

    async def claim_value(self, app_id: str, key: str, owner: str, ttl: float) -> bool:
        """See :meth:`broadcaster.backends.base.Backend.claim_value`."""
        self._check_ready()
        try:
            return await claim_via_redis(self._client, self.prefix, app_id, key, owner, ttl)
        except _ERRORS as exc:
            raise self._failed("claim a key", exc) from exc

    async def release_value(self, app_id: str, key: str, owner: str) -> bool:
        """See :meth:`broadcaster.backends.base.Backend.release_value`."""
        self._check_ready()
        try:
            return await release_via_redis(self._client, self.prefix, app_id, key, owner)
        except _ERRORS as exc:
            raise self._failed("release a claim", exc) from exc

    async def claim_holder(self, app_id: str, key: str) -> str | None:
        """See :meth:`broadcaster.backends.base.Backend.claim_holder`."""
        self._check_ready()
        try:
            held = await self._client.get(claim_key(self.prefix, app_id, key))
        except _ERRORS as exc:
            raise self._failed("read a claim", exc) from exc
        return held.decode() if isinstance(held, bytes) else held


def _refusal(exc: BaseException) -> str | None:
    """The error reply, shortened, when ``exc`` is one that refuses every write
    (``_REFUSALS``); else None. redis-py's own errors lose the code: their class has it."""
    if isinstance(exc, ReadOnlyError):
        text = f"READONLY {exc}"
    elif isinstance(exc, OutOfMemoryError):
        text = f"OOM {exc}"
    elif isinstance(exc, ResponseError) and str(exc).partition(" ")[0] in _REFUSALS:
        text = str(exc)
    else:
        return None
    return text.partition(".")[0][:200]


def _give_up(batch: list[tuple[bytes, bytes, asyncio.Future[None]]], reason: str) -> None:
    """Release the callers of pub/sub commands not confirmed (a reconnection restores
    the subscriptions)."""
    for kind, name, waiter in batch:
        if not waiter.done():
            log.debug("%s %r not confirmed (%s); restored on reconnection", kind, name, reason)
            waiter.set_result(None)


def _check_options(
    prefix: str,
    node_id: str | None,
    node_ttl: float,
    heartbeat_interval: float | None,
    reconnect_min: float,
    reconnect_max: float,
) -> None:
    if not prefix or any(c.isspace() for c in prefix):
        raise ValueError(f"prefix must be a non-empty string without spaces, got {prefix!r}")
    if node_id is not None and not _NAME.fullmatch(node_id):
        raise ValueError(f"node_id may contain only letters, digits and _.- , got {node_id!r}")
    if not node_ttl > 0:
        raise ValueError(f"node_ttl must be a positive number of seconds, got {node_ttl!r}")
    if heartbeat_interval is not None and not 0 < heartbeat_interval < node_ttl:
        raise ValueError(
            f"heartbeat_interval must be between 0 and node_ttl ({node_ttl!r}), "
            f"got {heartbeat_interval!r}"
        )
    if not 0 < reconnect_min <= reconnect_max:
        raise ValueError(
            f"need 0 < reconnect_min <= reconnect_max, got {reconnect_min!r} and {reconnect_max!r}"
        )
