"""The Redis backend's core: options, state, lifecycle, readiness, values and history.

:class:`BackendCore` holds what every topology shares; the parts that differ or stand
apart are mixed in from their own modules (:mod:`.pubsub`, :mod:`.batching`,
:mod:`.presence`, :mod:`.liveness`) and composed in :mod:`.backend` (standalone and
Sentinel) and :mod:`.cluster` (Redis Cluster).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import (
    AuthenticationError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from broadcaster._routes import RouteTable
from broadcaster.backends._runs import RedisRunIndex
from broadcaster.backends.base import (
    DEFAULT_HISTORY_META_TTL,
    DEFAULT_HISTORY_SIZE,
    DEFAULT_HISTORY_TTL,
    BackendUnavailable,
    ControlHandler,
    EncodedHandler,
    HistoryResult,
    PublicationHandler,
    PublishUnconfirmed,
    check_history_options,
    new_epoch,
)
from broadcaster.backends.redis import scripts
from broadcaster.backends.redis.codec import (
    decode_publication,
    ms,
    route_head,
    text,
)
from broadcaster.backends.redis.layout import (
    DEFAULT_PREFIX,
    app_key,
    channel_key,
    control_channel,
    nodes_key,
    publication_channel,
    value_key,
)
from broadcaster.backends.redis.publish import (
    check_wait,
    store_value_via_redis,
)
from broadcaster.backends.redis.resp import (
    PubSubReader,
    ReplyReader,
)
from broadcaster.backends.redis.topology import topology_for
from broadcaster.publication import Position, Publication

__all__ = [
    "ERRORS",
    "PROBE_INTERVAL",
    "PROBE_TTL_MS",
    "BackendCore",
    "PendingPublication",
    "pending_publication",
    "refusal_of",
]

log = logging.getLogger(__name__)

ERRORS = (RedisError, OSError)
"""Errors of a command to Redis."""
_ERRORS = ERRORS
PROBE_INTERVAL = 1.0  # seconds between readiness PINGs (at once after a failed command)
# Failures that mean Redis did not answer (rather than refused a command).
_UNANSWERED = (RedisTimeoutError, RedisConnectionError, OSError)
# Error replies that say this Redis takes no writes now, whatever the command: a replica
# (demoted primary, or the URL names one), out of memory, a failed snapshot with
# stop-writes-on-bgsave-error, loading its data set, min-replicas-to-write unmet, a
# cluster without all its slots. The node is not ready until a write goes through.
_REFUSALS = frozenset(
    ("READONLY", "OOM", "MISCONF", "LOADING", "MASTERDOWN", "NOREPLICAS", "CLUSTERDOWN")
)
PROBE_TTL_MS = 10_000  # the write-probe key's lifetime


@dataclass(frozen=True, slots=True)
class PendingPublication:
    """A publication waiting for this tick's pipeline, and its caller's future."""

    publication: Publication
    history: bool
    done: asyncio.Future[Position | None]


_new = object.__new__
_set_pending = tuple(
    PendingPublication.__dict__[name].__set__ for name in ("publication", "history", "done")
)


def pending_publication(
    publication: Publication, history: bool, done: asyncio.Future[Position | None]
) -> PendingPublication:
    """``PendingPublication(publication, history, done)``, with its slots set directly
    (the frozen dataclass's ``__init__`` goes through ``object.__setattr__`` for each):
    one per publication."""
    set_publication, set_history, set_done = _set_pending
    pending: PendingPublication = _new(PendingPublication)
    set_publication(pending, publication)
    set_history(pending, history)
    set_done(pending, done)
    return pending


_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


class BackendCore:
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
    _direct_routes: ClassVar[bool] = False
    """The pub/sub reader takes direct routes (:mod:`broadcaster._routes`)."""

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
        self._breaks = 0
        self.routes: RouteTable | None = None
        """The direct routes of the pub/sub reader (None: it takes none); the hub
        attaches and detaches them."""
        if self._direct_routes:
            self.routes = RouteTable(self._route_name, route_head)
        self._node_id = node_id or secrets.token_hex(8)
        self._nodes_key = nodes_key(prefix)
        self._client: Redis = self._topology.client
        self._prober: Redis = self._topology.prober
        self._runs = RedisRunIndex(lambda: self._client, prefix)
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
        self._loop: asyncio.AbstractEventLoop | None = None  # while started
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
        self._outbox: list[PendingPublication] = []  # publications of this tick, not sent yet
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
    def runs(self) -> RedisRunIndex:
        """The deployment's run index (:mod:`broadcaster.backends._runs`)."""
        return self._runs

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

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def breaks(self) -> int:
        """Times the node stopped reading a server that may still take publications
        (see :attr:`broadcaster.backends.base.Broker.breaks`)."""
        return self._breaks

    @breaks.setter
    def breaks(self, value: int) -> None:
        # Every publication takes the hub's full path from now on: it marks the break.
        self._breaks = value
        if self.routes is not None:
            self.routes.clear()

    def _route_name(self, app_id: str, channel: str) -> bytes:
        return publication_channel(self.prefix, app_id, channel).encode()

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
        # The loop it runs in, for the publish path (asyncio.get_running_loop() makes a
        # getpid system call each time).
        self._loop = asyncio.get_running_loop()
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
        await self._sent()  # publications already accepted still go out
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

    # -- values, control messages, history ---------------------------------------------------

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

    # -- names and errors --------------------------------------------------------------------

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
        elif (refusal := refusal_of(exc)) is not None:
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

    # -- what the parts below provide (pub/sub, batches, liveness) -----------------------

    async def _connect(self) -> None:
        """Connect, subscribe every channel, write this node's state; then ready."""
        raise NotImplementedError

    async def _supervise(self) -> None:
        """Keep the pub/sub connection(s) up until stopped."""
        raise NotImplementedError

    async def _drop_pubsub(self) -> None:
        """Close the pub/sub connection(s)."""
        raise NotImplementedError

    async def _ping_pubsub(self) -> bool:
        """PING the pub/sub connection(s); False if the node must reconnect first."""
        raise NotImplementedError

    async def _after_probe(self) -> None:
        """After a readiness probe that found Redis not answering."""
        raise NotImplementedError

    async def _drop_publisher(self) -> None:
        """Close the publications' connection, if any."""
        raise NotImplementedError

    async def _sent(self) -> None:
        """Wait until the writes in flight (and those they send after them) are done."""
        while self._sending:
            await asyncio.gather(*self._sending, return_exceptions=True)

    async def _restore(self) -> None:
        """Write this node's heartbeat, counts and presence entries."""
        raise NotImplementedError

    async def _withdraw(self) -> None:
        """Remove this node's heartbeat, counts and presence entries."""
        raise NotImplementedError

    async def _heartbeat_forever(self) -> None:
        raise NotImplementedError

    async def _probe_forever(self) -> None:
        raise NotImplementedError

    async def _liveness(self) -> str:
        """The live nodes, as the presence and count scripts take them."""
        raise NotImplementedError

    async def _switched(self, host: str, port: int) -> None:
        """The primary moved to ``host:port`` (Sentinel named it)."""
        raise NotImplementedError

    def _refresh_counts(self, pipe: Any, app_id: str) -> None:
        """Add to ``pipe`` what keeps this node's counts of ``app_id`` alive."""
        raise NotImplementedError


def refusal_of(exc: BaseException) -> str | None:
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
