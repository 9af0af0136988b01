"""Publishers: how agent processes put envelopes on channels (docs/protocol.md,
``CanBroadcastAgentEvents``).

One small interface, :class:`Publisher`, with implementations for each path:

- :class:`RecordingPublisher` keeps what it was given (tests, debugging);
- :class:`PusherHTTPPublisher` signs requests to the Pusher HTTP API of this server
  or any Pusher-compatible one;
- :class:`InProcessPublisher` publishes into the embedded server's node (no network);
- :class:`RedisPublisher` publishes through Redis along the Redis backend's own path
  (:func:`broadcaster.backends.redis.publish_via_redis`), so a worker process needs no
  server of its own.

Sessions' final states (for reconcile) are kept by a :class:`StateStore`: one on the
node's backend, one straight on Redis for workers; the Pusher HTTP, in-process and Redis
publishers are state stores too (the Pusher HTTP one signs ``PUT
/apps/{app_id}/channels/{channel}/state``), so whoever publishes a run can store its
final state on the same server.

Every publisher is an async context manager: ``async with`` delivers what is buffered
and releases the publisher on exit (:meth:`Publisher.aclose`).

Network publishers never block the agent: :meth:`Publisher.broadcast` enqueues into a
bounded buffer that one sender task drains in order, retrying failures with capped,
jittered exponential backoff. What cannot be buffered, or is refused for good by the
target (bad credentials, oversize), is dropped, counted in :attr:`PublisherStats.dropped`
and logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self, runtime_checkable
from urllib.parse import quote, urlencode

import httpx
import orjson
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential_jitter

from broadcaster.backends.base import Backend, BackendUnavailable
from broadcaster.envelope import Envelope
from broadcaster.publication import Publication
from broadcaster.run_index import RunRecorder
from broadcaster.signing import signed_params

if TYPE_CHECKING:
    from collections.abc import Sequence

    from redis.asyncio import Redis
    from redis.asyncio.cluster import RedisCluster
    from redis.asyncio.connection import AbstractConnection

    from broadcaster.backends.redis.resp import ReplyReader
    from broadcaster.publication import Position

__all__ = [
    "STATE_TTL",
    "BackendStateStore",
    "BufferedPublisher",
    "InProcessPublisher",
    "LocalNode",
    "Outgoing",
    "PublishError",
    "Publisher",
    "PublisherStats",
    "PusherHTTPPublisher",
    "RecordingPublisher",
    "RedisPublisher",
    "RedisStateStore",
    "StateStore",
    "encode",
    "run_recorder",
    "state_key",
]

STATE_TTL = 24 * 3600.0
"""Seconds a session's final state is kept for reconcile (default)."""

logger = logging.getLogger("broadcaster.publishers")


class PublishError(Exception):
    """The target could not take a publication. ``retryable`` says whether trying again
    may help (a network error, a 5xx) or not (401, 413, ...)."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One publication, encoded once: Pusher event name, channel, data text."""

    channel: str
    event: str
    data: str


_FIRST_PAUSE = 0.05  # seconds before a failed send is tried again; then doubling
_MAX_PAUSE = 5.0
_JITTER = 0.1


def _is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, PublishError) and exc.retryable


def encode(channel: str, envelope: Envelope) -> Outgoing:
    """The publication for ``envelope``: event name = envelope type, data = its JSON."""
    return Outgoing(channel=channel, event=envelope.type, data=envelope.to_json().decode())


@dataclass
class PublisherStats:
    """What a buffered publisher did: publications the target took, publications
    dropped, attempts that failed and were retried, the last error, and the sends
    (round trips or requests) that carried the published ones."""

    published: int = 0
    dropped: int = 0
    retries: int = 0
    last_error: str | None = None
    sends: int = 0


class Publisher(Protocol):
    """Puts envelopes on channels.

    A publisher whose :meth:`broadcast` never waits (it only buffers) may say so with a
    true ``never_waits`` attribute: the envelope adapter then flushes the streamed text
    of all its sessions in one go (``agent_core.adapters.broadcasting``).
    """

    stats: PublisherStats

    async def broadcast(self, channel: str, envelope: Envelope) -> None:
        """Publish ``envelope`` on ``channel`` (buffered publishers return at once)."""
        ...

    async def aclose(self) -> None:
        """Deliver what is buffered (within a bounded time) and release resources."""
        ...


@dataclass
class RecordingPublisher:
    """Keeps every envelope it is given, in order. For tests and debugging."""

    records: list[tuple[str, Envelope]] = field(default_factory=list)
    stats: PublisherStats = field(default_factory=PublisherStats)
    never_waits: ClassVar[bool] = True  # see Publisher

    async def broadcast(self, channel: str, envelope: Envelope) -> None:
        self.records.append((channel, envelope))
        self.stats.published += 1

    async def aclose(self) -> None:
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def envelopes(self, channel: str | None = None) -> list[Envelope]:
        return [env for ch, env in self.records if channel is None or ch == channel]


class BufferedPublisher(ABC):
    """A bounded, ordered buffer drained by one sender task with retries.

    Args:
        max_buffer: envelopes kept while the target is unreachable; beyond it new
            envelopes are dropped (counted and logged).
        max_batch: how many buffered publications one send may carry.
        close_timeout: how long :meth:`aclose` keeps trying to deliver the buffer.
    """

    never_waits: ClassVar[bool] = True  # broadcast() only buffers (see Publisher)

    def __init__(
        self, *, max_buffer: int = 10_000, max_batch: int = 10, close_timeout: float = 5.0
    ) -> None:
        self.stats = PublisherStats()
        self._buffer: deque[Outgoing] = deque()
        self._max_buffer = max_buffer
        self._max_batch = max_batch
        self._close_timeout = close_timeout
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._sender: asyncio.Task[None] | None = None
        self._closing = False

    @abstractmethod
    async def _send(self, batch: list[Outgoing]) -> None:
        """Deliver ``batch`` in order or raise :class:`PublishError`."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Deliver the buffer (within ``close_timeout``) and release the publisher."""
        await self.aclose()

    async def broadcast(self, channel: str, envelope: Envelope) -> None:
        self.enqueue(encode(channel, envelope))

    def enqueue(self, item: Outgoing) -> None:
        """Buffer one encoded publication (never blocks)."""
        if self._closing:
            raise RuntimeError(f"{type(self).__name__} is closed; create a new publisher")
        if len(self._buffer) >= self._max_buffer:
            self._drop(1, f"buffer full ({self._max_buffer} publications)")
            return
        self._buffer.append(item)
        self._idle.clear()
        self._wakeup.set()
        if self._sender is None:
            self._sender = asyncio.get_running_loop().create_task(self._run())

    async def flush(self, within: float | None = None) -> bool:
        """Wait until the buffer is delivered; False if ``within`` seconds passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), within)
        except TimeoutError:
            return False
        return True

    async def aclose(self) -> None:
        self._closing = True
        delivered = await self.flush(self._close_timeout)
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
        if not delivered and self._buffer:
            self._drop(len(self._buffer), "closed before the target accepted them")
            self._buffer.clear()
        await self._release()

    async def _release(self) -> None:
        """Close network resources (subclasses that own some override this)."""
        return

    def _drop(self, count: int, why: str) -> None:
        self.stats.dropped += count
        logger.warning("%s dropped %d publication(s): %s", type(self).__name__, count, why)

    async def _run(self) -> None:
        try:
            while True:
                await self._wakeup.wait()
                self._wakeup.clear()
                while self._buffer:
                    size = min(self._max_batch, len(self._buffer))
                    await self._deliver([self._buffer[i] for i in range(size)])
                    for _ in range(size):
                        self._buffer.popleft()
                self._idle.set()
        except asyncio.CancelledError:
            # Cancelled by aclose(), or by asyncio.run() ending with the publisher never
            # closed (the short form of the README's examples): what this publisher
            # opened is released with the loop that used it, not left to the GC.
            await self._release()
            raise

    async def _deliver(self, batch: list[Outgoing]) -> None:
        try:
            try:
                # The usual send needs no retry machinery: a tenacity loop costs about
                # 27 µs a send, a tenth of an agent's CPU per streamed chunk.
                await self._send(batch)
            except PublishError as exc:
                if not exc.retryable:
                    raise
                await self._send_again(batch, exc)
        except PublishError as exc:
            self.stats.last_error = str(exc)
            self._drop(len(batch), str(exc))
            return
        self.stats.published += len(batch)
        self.stats.sends += 1

    async def _send_again(self, batch: list[Outgoing], failed: PublishError) -> None:
        """Retry ``batch`` after its first send ``failed``: pauses of 0.05 s, doubling up
        to 5 s, each with up to 0.1 s of jitter, for as long as the error is retryable."""
        self._note_retry(failed)
        await asyncio.sleep(_FIRST_PAUSE + random.uniform(0, _JITTER))  # noqa: S311 - jitter
        retrying = AsyncRetrying(
            retry=retry_if_exception(_is_retryable),
            # The pauses after the first: 0.1 s, 0.2 s, ...
            wait=wait_exponential_jitter(
                multiplier=2 * _FIRST_PAUSE, max=_MAX_PAUSE, jitter=_JITTER
            ),
            before_sleep=self._note_retry_state,
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                await self._send(batch)

    def _note_retry_state(self, state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        self._note_retry(exc)

    def _note_retry(self, exc: BaseException | None) -> None:
        self.stats.retries += 1
        self.stats.last_error = str(exc)
        logger.warning("%s cannot publish, will retry: %s", type(self).__name__, exc)


class PusherHTTPPublisher(BufferedPublisher):
    """Publishes through the Pusher HTTP API (``/apps/{id}/events`` and
    ``batch_events``), signed with the app secret; works against this server and any
    Pusher-compatible one.

    Args:
        base_url: e.g. ``http://127.0.0.1:8080``.
        app_id, key, secret: the app's credentials.
        client: an ``httpx.AsyncClient`` to reuse (else one is created and owned).
    """

    def __init__(
        self,
        base_url: str,
        app_id: str,
        key: str,
        secret: str,
        *,
        client: httpx.AsyncClient | None = None,
        timeout: float = 5.0,
        max_buffer: int = 10_000,
        close_timeout: float = 5.0,
    ) -> None:
        # The batch_events endpoint takes at most 10 events per request.
        super().__init__(max_buffer=max_buffer, max_batch=10, close_timeout=close_timeout)
        self._base = base_url.rstrip("/")
        self._app_id = app_id
        self._key = key
        self._secret = secret
        self._owns_client = client is None
        self._client = client or httpx.AsyncClient(timeout=timeout)

    async def _send(self, batch: list[Outgoing]) -> None:
        if len(batch) == 1:
            item = batch[0]
            path = f"/apps/{self._app_id}/events"
            body = {"name": item.event, "channel": item.channel, "data": item.data}
            await self._post(path, orjson.dumps(body))
            return
        path = f"/apps/{self._app_id}/batch_events"
        events = [{"name": i.event, "channel": i.channel, "data": i.data} for i in batch]
        await self._post(path, orjson.dumps({"batch": events}))

    async def save(self, channel: str, snapshot: bytes) -> None:
        """Store the final state (slim snapshot JSON) of the session on ``channel`` on the
        server, for ``GET /api/sessions/{id}/state``: a signed ``PUT
        /apps/{app_id}/channels/{channel}/state``, sent after what is buffered so far.

        Raises:
            PublishError: the server refused it or cannot be reached.
        """
        await self.flush(self._close_timeout)
        path = f"/apps/{self._app_id}/channels/{quote(channel, safe='')}/state"
        await self._post(path, snapshot, method="PUT")

    async def _post(self, path: str, body: bytes, method: str = "POST") -> None:
        params = signed_params(self._key, self._secret, method, path, body)
        url = f"{self._base}{path}?{urlencode(params)}"
        headers = {"Content-Type": "application/json"}
        try:
            response = await self._client.request(method, url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise PublishError(f"cannot reach {self._base}: {exc!r}", retryable=True) from exc
        if response.status_code >= 300:
            retryable = response.status_code >= 500 or response.status_code == 429
            raise PublishError(
                f"{path} answered {response.status_code}: {response.text[:200]}",
                retryable=retryable,
            )

    async def _release(self) -> None:
        if self._owns_client:
            await self._client.aclose()


class LocalNode(Protocol):
    """What :class:`InProcessPublisher` uses of the server's node (``broadcaster.node.
    Node`` has it; this module, which agent processes import, does not import it)."""

    @property
    def backend(self) -> Backend: ...

    async def publish(
        self,
        app_id: str,
        channels: Sequence[str],
        event: str,
        data: str,
        exclude_socket_id: str | None = None,
    ) -> dict[str, Position | None]: ...


class InProcessPublisher:
    """Publishes into the node of the server this process runs (no network).

    Publication is awaited: when :meth:`broadcast` returns the envelope has its
    position and has been handed to local subscribers (memory backend) or to Redis.
    A backend that is unavailable raises :class:`PublishError` (retryable).
    """

    def __init__(self, node: LocalNode, app_id: str) -> None:
        self._node = node
        self._app_id = app_id
        self.stats = PublisherStats()

    async def broadcast(self, channel: str, envelope: Envelope) -> None:
        item = encode(channel, envelope)
        try:
            await self._node.publish(self._app_id, [item.channel], item.event, item.data)
        except BackendUnavailable as exc:
            self.stats.last_error = str(exc)
            self.stats.dropped += 1
            raise PublishError(str(exc), retryable=True) from exc
        self.stats.published += 1

    async def save(self, channel: str, snapshot: bytes) -> None:
        """Store the session's final state through the node's backend (see
        :class:`BackendStateStore`)."""
        await BackendStateStore(self._node.backend, self._app_id).save(channel, snapshot)

    async def aclose(self) -> None:
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class RedisPublisher(BufferedPublisher):
    """Publishes through Redis exactly as the server's Redis backend does (one Lua
    script: position, history, PUBLISH), with a bounded retry buffer.

    Args:
        client: a ``redis.asyncio.Redis`` client of the deployment's Redis (for Redis
            Cluster a ``RedisCluster`` from
            :func:`broadcaster.backends.redis.clients.cluster_client`; for Sentinel
            :func:`broadcaster.backends.redis.clients.sentinel_client`).
        app_id: the app whose channels receive the envelopes.
        prefix: the deployment's key prefix (the servers' ``--redis-prefix``).
        max_batch: publications one round trip may carry (Redis Cluster: always 1).
        wait_replicas: the durable mode, as the servers' ``--redis-wait-replicas``: a
            publication counts as published only once Redis ``WAIT`` confirms that this
            many replicas keep it; otherwise it is sent again (the one refused may still
            be in the primary's history: at least once, not exactly once).
        wait_timeout: seconds ``WAIT`` may wait.
    """

    def __init__(
        self,
        client: Redis | RedisCluster,
        app_id: str,
        *,
        prefix: str | None = None,
        max_buffer: int = 10_000,
        max_batch: int = 100,
        close_timeout: float = 5.0,
        wait_replicas: int = 0,
        wait_timeout: float = 1.0,
    ) -> None:
        from broadcaster.backends.redis.layout import DEFAULT_PREFIX

        # What was buffered while a round trip was in flight goes in the next one, as
        # one pipeline: many sessions in one process share round trips. On a cluster a
        # batch would span shards, so one publication per round trip there.
        cluster = _is_cluster(client)
        batch = 1 if cluster else max_batch
        super().__init__(max_buffer=max_buffer, max_batch=batch, close_timeout=close_timeout)
        self._client = client
        self._app_id = app_id
        self._prefix = prefix or DEFAULT_PREFIX
        self._wait_replicas = wait_replicas
        self._wait_timeout = wait_timeout
        # Its own connection, read by a ReplyReader (see _pipeline); opened on first use.
        self._conn: tuple[AbstractConnection, ReplyReader] | None = None

    async def _send(self, batch: list[Outgoing]) -> None:
        from redis.asyncio.cluster import RedisCluster
        from redis.exceptions import RedisError

        from broadcaster.backends.redis.publish import publish_via_redis_cluster

        publications = [
            Publication(self._app_id, item.channel, item.event, item.data) for item in batch
        ]
        client = self._client
        try:
            if isinstance(client, RedisCluster):  # hash-tagged keys, SPUBLISH
                for publication in publications:
                    await publish_via_redis_cluster(
                        client,
                        self._prefix,
                        publication,
                        wait_replicas=self._wait_replicas,
                        wait_timeout=self._wait_timeout,
                    )
            else:
                await self._pipeline(client, publications)
        except (RedisError, OSError, BackendUnavailable, TimeoutError) as exc:
            raise PublishError(f"cannot publish through Redis: {exc}", retryable=True) from exc

    async def _pipeline(self, client: Redis, publications: list[Publication]) -> None:
        """The batch in one round trip on this publisher's own connection, as
        :func:`~broadcaster.backends.redis.publish.publish_many_via_redis` sends it
        (same commands, same replies), but read by a
        :class:`~broadcaster.backends.redis.resp.ReplyReader`: no pool checkout, and no
        coroutine, await or timer per reply, only one per round trip. A connection
        that fails or times out is closed; the next round trip opens a new one."""
        from broadcaster.backends.redis.publish import publish_many_with

        await publish_many_with(
            lambda packed, replies: self._round_trip(client, packed, replies),
            client,
            self._prefix,
            publications,
            wait_replicas=self._wait_replicas,
            wait_timeout=self._wait_timeout,
        )

    async def _round_trip(self, client: Redis, packed: bytes, count: int) -> list[Any]:
        from broadcaster.backends.redis.resp import connected_reply_reader

        if self._conn is None:
            conn: AbstractConnection = client.connection_pool.make_connection()  # type: ignore[no-untyped-call]
            self._conn = (conn, await connected_reply_reader(conn))
        conn, reader = self._conn
        waiter = reader.expect(count)
        try:
            reader.write(packed)
            timeout = getattr(conn, "socket_timeout", None)
            if timeout is None:
                return await waiter
            extra = self._wait_timeout if self._wait_replicas else 0.0
            return await asyncio.wait_for(waiter, timeout + extra)
        except BaseException:
            # Replies may still be on their way: never read this connection again.
            await self._drop_connection()
            raise

    async def _drop_connection(self) -> None:
        held, self._conn = self._conn, None
        if held is not None:
            with contextlib.suppress(Exception):
                await held[0].disconnect(nowait=True)

    async def _release(self) -> None:
        await self._drop_connection()

    async def save(self, channel: str, snapshot: bytes) -> None:
        """Store the session's final state where the servers read it (see
        :class:`RedisStateStore`), after what is buffered so far."""
        await self.flush(self._close_timeout)
        await RedisStateStore(self._client, self._app_id, prefix=self._prefix).save(
            channel, snapshot
        )


def _is_cluster(client: object) -> bool:
    from redis.asyncio.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def state_key(channel: str) -> str:
    """The stored-value key of the final state of the session publishing on
    ``channel``. Keyed by channel, so a private session's state is only served to
    whoever may see ``private-agent.<id>`` (see :mod:`broadcaster.sessions`)."""
    return f"state:{channel}"


@runtime_checkable
class StateStore(Protocol):
    """Keeps sessions' final slim snapshots for the reconcile endpoint."""

    async def save(self, channel: str, snapshot: bytes) -> None:
        """Store (replace) the snapshot (JSON bytes) of the session on ``channel``."""
        ...


def run_recorder(store: object) -> RunRecorder | None:
    """The run index recorder of a state store (None for one that keeps no index):
    the :class:`BackendStateStore` and :class:`RedisStateStore` both record runs."""
    runs = getattr(store, "runs", None)
    return runs if isinstance(runs, RunRecorder) else None


async def _index_snapshot(runs: RunRecorder, channel: str, snapshot: bytes) -> None:
    """Record the end of the run a stored snapshot names (``metadata.execution_id``,
    as the adapters and outside agents write it), so that storing a state is enough to
    index its run."""
    try:
        data = orjson.loads(snapshot)
        metadata = data.get("metadata") if isinstance(data, dict) else None
        execution_id = metadata.get("execution_id") if isinstance(metadata, dict) else None
    except orjson.JSONDecodeError:
        return
    if isinstance(execution_id, str) and 0 < len(execution_id) <= 128:
        error = data.get("error_message")
        await runs.ended(
            channel,
            execution_id,
            status=str(data.get("status")),
            error=error if isinstance(error, str) else None,
            snapshot=data,
        )


class BackendStateStore:
    """Stores snapshots through the server's backend (memory or Redis), and records
    runs in its run index (:attr:`runs`)."""

    def __init__(self, backend: Backend, app_id: str, ttl: float = STATE_TTL) -> None:
        self._backend = backend
        self._app_id = app_id
        self._ttl = ttl
        self.runs = RunRecorder(backend.runs, app_id, ttl)

    async def save(self, channel: str, snapshot: bytes) -> None:
        await self._backend.store_value(self._app_id, state_key(channel), snapshot, self._ttl)
        await _index_snapshot(self.runs, channel, snapshot)


class RedisStateStore:
    """Stores snapshots in Redis where the servers' Redis backend reads them, and
    records runs in the deployment's run index (:attr:`runs`)."""

    def __init__(
        self,
        client: Redis | RedisCluster,
        app_id: str,
        *,
        prefix: str | None = None,
        ttl: float = STATE_TTL,
    ) -> None:
        from broadcaster.backends._runs import RedisRunIndex
        from broadcaster.backends.redis.layout import DEFAULT_PREFIX

        self._client = client
        self._app_id = app_id
        self._prefix = prefix or DEFAULT_PREFIX
        self._ttl = ttl
        self.runs = RunRecorder(RedisRunIndex(lambda: client, self._prefix), app_id, ttl)

    async def save(self, channel: str, snapshot: bytes) -> None:
        from broadcaster.backends.redis.publish import store_value_via_redis

        key = state_key(channel)
        await store_value_via_redis(
            self._client, self._prefix, self._app_id, key, snapshot, self._ttl
        )
        await _index_snapshot(self.runs, channel, snapshot)
