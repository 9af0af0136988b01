"""The scaled-out shape: ``web`` only fans out, ``worker`` processes run the agents.

With ``AGENT_DEMO_RUN_MODE=queue`` the demo's ``POST /run`` does not run the agent in
the web process: :class:`RunQueue` claims the session (one run at a time, across every
process), reads the channel's position and queues the job in Redis. ``agent-worker``
(:class:`Worker`) takes jobs off that queue and runs them with a
:class:`~broadcaster.publishers.RedisPublisher` and a
:class:`~broadcaster.publishers.RedisStateStore`, i.e. along the Redis backend's own
path, so any server node subscribed to the session's channel delivers the envelopes and
serves the final state.

Leases: every queued run has a deadline in ``run-leases``. While it waits, the deadline
is ``queue_timeout`` after it was queued; a worker that takes it sets it to ``lease``
seconds ahead and renews it (with the session's claim) every third of that. Any worker,
and the web node, look for runs past their deadline every third of their lease and end
them ``failed`` (:func:`agent_core.app.runs.end_abandoned`): a final state is stored, the
final ``agent.status`` is published and the session is free again. So a SIGKILLed
worker's run ends within ``lease`` plus a reap interval, and a run no worker takes ends
after ``queue_timeout``. A worker that finds its lease gone (it stalled past it) stops
that run. The queue is bounded (``queue_max``) and so are each client's queued and
running runs.

Redis keys (``P`` = prefix, ``A`` = app id, ``R`` = a run's id)::

    P:{A}:runs                  list of queued run ids, RPUSH by web, BLPOP by workers
    P:{A}:run-jobs              hash R -> the job (JSON)
    P:{A}:run-leases            sorted set R -> deadline (ms, Redis time)
    P:{A}:run-takers            hash R -> the worker that took it
    P:{A}:client-runs:<client>  sorted set R -> deadline: a client's queued/running runs
    P:{A}:claim:run:<session>   the session's claim (R), as local runs claim it
    P:A:value:state:<channel>   a session's final state (read apart, in any slot)

Every key one script touches carries the hash tag ``{A}``, on every topology: on Redis
Cluster all of them live in the app's slot, so each script is one atomic step on one
primary (Redis refuses a script whose keys span slots), and standalone Redis and
Sentinel use the very same names (to them the braces are plain characters). One layout
means one code path and no setting that could disagree between web nodes and workers;
the price is that one app's run queue is served by one primary of a cluster, which
holds for the rates of run starts (the publications of the runs spread over every
slot, one per channel). ``{A}`` is the tag the cluster backend already gives an app's
subscription counts and control channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import click
import orjson
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict
from redis.exceptions import RedisError

from agent_core.app.demo_routing import DemoParts, demo_parts
from agent_core.app.runs import (
    ClientRateLimit,
    RunHandle,
    RunManager,
    RunMode,
    RunRequest,
    RunsFull,
    SessionBusy,
    TooManyRuns,
    end_abandoned,
    new_execution_id,
    new_session_id,
    resolve_mode,
    run_claim,
)
from broadcaster._text import EXCERPT_LENGTH, excerpt
from broadcaster.backends.clients import RedisClient, display_url, redis_client
from broadcaster.backends.redis import DEFAULT_PREFIX, claim_key, value_key
from broadcaster.envelope import channel_for
from broadcaster.publishers import RedisPublisher, RedisStateStore, state_key

__all__ = ["LEASE", "QUEUE_TIMEOUT", "Reaper", "RunQueue", "Worker", "WorkerSettings", "main"]

logger = logging.getLogger(__name__)

LEASE = 15.0
"""Seconds a worker's hold on a run lasts unless renewed (every third of it)."""
QUEUE_TIMEOUT = 600.0
"""Seconds a queued run may wait for a worker."""
REAP_BATCH = 100


@dataclass(frozen=True)
class _Keys:
    """The Redis keys of one deployment's app."""

    prefix: str
    app_id: str

    def _key(self, name: str) -> str:
        return f"{self.prefix}:{{{self.app_id}}}:{name}"

    @property
    def queue(self) -> str:
        return self._key("runs")

    @property
    def jobs(self) -> str:
        return self._key("run-jobs")

    @property
    def leases(self) -> str:
        return self._key("run-leases")

    @property
    def takers(self) -> str:
        return self._key("run-takers")

    def claim(self, session_id: str) -> str:
        return claim_key(self.prefix, self.app_id, run_claim(session_id))

    def client(self, client: str | None) -> str:
        return self._key(f"client-runs:{client or '-'}")


_NOW = "local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000)\n"

_ADMIT = (
    _NOW
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 'busy' end
if redis.call('LLEN', KEYS[2]) >= tonumber(ARGV[3]) then return 'full' end
local limit = tonumber(ARGV[4])
if limit > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= limit then return 'client' end
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), ARGV[1])
  if redis.call('PTTL', KEYS[3]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[3], ARGV[2])
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 'ok'
"""
)
"""Claim the session for run ARGV[1] unless it is busy, the queue is full or the
client has too many runs. KEYS: claim, queue, client set. ARGV: run id, claim ms,
queue max, client limit (0: none)."""

_ENQUEUE = (
    _NOW
    + """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[1])
redis.call('RPUSH', KEYS[4], ARGV[1])
return 1
"""
)
"""KEYS: claim, jobs, leases, queue. ARGV: run id, job, queue timeout ms."""

_TAKE = (
    _NOW
    + """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return false end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
return redis.call('HGET', KEYS[2], ARGV[1])
"""
)
"""The job of run ARGV[1], now leased to worker ARGV[3] for ARGV[2] ms (nil: it was
ended meanwhile). KEYS: leases, jobs, takers."""

_RENEW = (
    _NOW
    + """
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
local lease = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + lease, ARGV[1])
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('PEXPIRE', KEYS[2], lease) end
if redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  redis.call('ZADD', KEYS[3], now + lease, ARGV[1])
  if redis.call('PTTL', KEYS[3]) < lease then redis.call('PEXPIRE', KEYS[3], lease) end
end
return 1
"""
)
"""Renew run ARGV[1]'s lease (and its session claim, its client entry) for ARGV[2] ms;
0 when the run is no longer leased. KEYS: leases, claim, client set."""

_FINISH = """
local mine = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
if redis.call('GET', KEYS[4]) == ARGV[1] then redis.call('DEL', KEYS[4]) end
return mine
"""
"""Forget run ARGV[1] and free its session and client entry; 1 when it was still
leased. KEYS: leases, jobs, takers, claim, client set."""

_WITHDRAW = "redis.call('LREM', KEYS[6], 1, ARGV[1])\n" + _FINISH
"""Take run ARGV[1] back off the queue too (a start whose enqueue reply was lost).
KEYS: leases, jobs, takers, claim, client set, queue."""

_REAP = (
    _NOW
    + """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
local out = {}
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local job = redis.call('HGET', KEYS[2], id)
  local taker = redis.call('HGET', KEYS[3], id)
  redis.call('HDEL', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  if not taker then redis.call('LREM', KEYS[4], 1, id) end
  if job then
    table.insert(out, job)
    table.insert(out, taker or '')
  end
end
return out
"""
)
"""Take up to ARGV[1] runs past their deadline off every structure: [job, taker ('':
never taken), ...]. KEYS: leases, jobs, takers, queue."""


def _job(handle: RunHandle, request: RunRequest, run_id: str, client: str | None) -> bytes:
    return orjson.dumps(
        {
            "run_id": run_id,
            "client": client,
            "session_id": handle.session_id,
            "execution_id": handle.execution_id,
            "channel": handle.channel,
            "position": handle.position,
            "request": request.model_dump(),
        }
    )


@dataclass(frozen=True)
class _Job:
    run_id: str
    client: str | None
    handle: RunHandle
    request: RunRequest


def _parse_job(raw: bytes) -> _Job:
    """Raises ValueError, KeyError, TypeError or ValidationError for a malformed job."""
    data = orjson.loads(raw)
    handle = RunHandle(
        data["session_id"], data["execution_id"], data["channel"], data.get("position")
    )
    request = RunRequest.model_validate(data["request"])
    return _Job(str(data["run_id"]), data.get("client"), handle, request)


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


async def _finish(redis: RedisClient, keys: _Keys, job: _Job) -> bool:
    """Free the run's session and client entry; True when its lease was still there."""
    done = await redis.eval(
        _FINISH,
        5,
        keys.leases,
        keys.jobs,
        keys.takers,
        keys.claim(job.handle.session_id),
        keys.client(job.client),
        job.run_id,
    )
    return bool(done)


@dataclass
class Reaper:
    """Ends runs past their deadline (a dead worker's, or queued too long) ``failed``,
    with a stored final state and a final ``agent.status``, and frees their sessions.

    Args:
        redis: the deployment's Redis.
        app_id: the runs' app.
        prefix: the deployment's key prefix.
        state_ttl: seconds the failed final states are kept.
    """

    redis: RedisClient
    app_id: str
    prefix: str = DEFAULT_PREFIX
    state_ttl: float = 86_400.0
    reaped: int = 0

    def __post_init__(self) -> None:
        self._keys = _Keys(self.prefix, self.app_id)
        self._publisher = RedisPublisher(self.redis, self.app_id, prefix=self.prefix)
        self._states = RedisStateStore(
            self.redis, self.app_id, prefix=self.prefix, ttl=self.state_ttl
        )

    async def reap(self) -> int:
        """End every run past its deadline; how many were ended.

        Raises:
            redis.exceptions.RedisError: Redis is unreachable.
        """
        ended = 0
        while True:
            keys = self._keys
            found = await self.redis.eval(
                _REAP, 4, keys.leases, keys.jobs, keys.takers, keys.queue, REAP_BATCH
            )
            for raw, taker in zip(found[::2], found[1::2], strict=True):
                try:
                    await self._end(_bytes(raw), _bytes(taker).decode())
                except Exception:  # the others must still end
                    logger.exception("cannot end an abandoned run")
                ended += 1
            if len(found) < 2 * REAP_BATCH:
                break
        self.reaped += ended
        return ended

    async def _end(self, raw: bytes, taker: str) -> None:
        try:
            job = _parse_job(raw)
        except (ValueError, KeyError, TypeError, ValidationError) as exc:
            logger.error("dropping a malformed run job (%s): %r", exc, raw[:200])
            return
        if taker:
            reason = (
                f"the worker running this run ({taker}) stopped renewing its lease: it died "
                "or lost Redis; the run was ended"
            )
        else:
            reason = "no worker took this run within the queue timeout"
        logger.warning("ending run %s of session %s: %s", job.run_id, job.handle.session_id, reason)
        try:
            await end_abandoned(
                self._publisher,
                self._states,
                job.handle,
                job.request,
                reason,
                load_snapshot=lambda channel: _load_snapshot(
                    self.redis, self.prefix, self.app_id, channel
                ),
                state_url=f"/api/sessions/{job.handle.session_id}/state",
            )
            await self._publisher.flush()
        finally:
            await _finish(self.redis, self._keys, job)

    async def run_forever(self, interval: float, stop: asyncio.Event | None = None) -> None:
        """Reap every ``interval`` seconds until ``stop`` is set (or cancelled)."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            try:
                await self.reap()
            except (RedisError, OSError) as exc:
                logger.warning("cannot look for abandoned runs (%s); retrying", exc)
            await _sleep_or_stop(stop, interval)

    async def aclose(self) -> None:
        await self._publisher.aclose()


async def _load_snapshot(
    redis: RedisClient, prefix: str, app_id: str, channel: str
) -> bytes | None:
    value: Any = await redis.get(value_key(prefix, app_id, state_key(channel)))
    return None if value is None else _bytes(value)


@dataclass
class RunQueue:
    """Starts runs by queueing them for workers (the web side of the scaled-out shape).

    Args:
        redis: the deployment's Redis.
        app_id: the app whose channels the runs publish on.
        position_of: the current position of a channel (the web node's backend).
        prefix: the deployment's key prefix.
        channel_for_session: the channel of a session.
        default_mode: the mode of a request that names none (the queued job carries
            the resolved mode, so workers need no setting).
        queue_max: runs waiting for a worker; more are refused (:class:`RunsFull`).
        queue_timeout: seconds a run may wait for a worker before it ends failed.
        lease: this node looks for abandoned runs every third of it.
        client_runs: queued and running runs one client may have (0: no limit).
        client_rate: how fast one client may queue runs (None: no limit).
        state_ttl: seconds the failed final states of abandoned runs are kept.
    """

    redis: RedisClient
    app_id: str
    position_of: Callable[[str], Awaitable[str | None]]
    prefix: str = DEFAULT_PREFIX
    channel_for_session: Callable[[str], str] = channel_for
    default_mode: RunMode = "agent"
    queue_max: int = 1000
    queue_timeout: float = QUEUE_TIMEOUT
    lease: float = LEASE
    client_runs: int = 0
    client_rate: ClientRateLimit | None = None
    state_ttl: float = 86_400.0
    _reaping: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self._keys = _Keys(self.prefix, self.app_id)
        self.reaper = Reaper(self.redis, self.app_id, self.prefix, self.state_ttl)

    def state_url(self, session_id: str) -> str:
        return f"/api/sessions/{session_id}/state"

    def start_reaping(self) -> None:
        """Look for abandoned runs in the background (every third of ``lease``), so
        they end even while no worker is running."""
        if self._reaping is None:
            loop = asyncio.get_running_loop()
            self._reaping = loop.create_task(self.reaper.run_forever(self.lease / 3))

    async def start(self, request: RunRequest, client: str | None = None) -> RunHandle:
        """Claim the session and queue the run.

        Raises:
            SessionBusy: another run of the session is queued or running.
            RunsFull: ``queue_max`` runs are waiting already.
            TooManyRuns: ``client`` has ``client_runs`` runs queued or running, or
                queued runs too fast.
            redis.exceptions.RedisError: Redis is unreachable.
        """
        session_id = request.session_id or new_session_id()
        if client is not None and self.client_rate is not None:
            self.client_rate.take(client)
        run_id = secrets.token_hex(8)
        try:
            await self._admit(session_id, run_id, client)
        except BaseException:
            if client is not None and self.client_rate is not None:
                self.client_rate.refund(client)
            raise
        try:
            return await self._enqueue(request, session_id, run_id, client)
        except BaseException:
            with contextlib.suppress(RedisError, OSError):
                await self._withdraw(session_id, run_id, client)
            raise

    async def _withdraw(self, session_id: str, run_id: str, client: str | None) -> None:
        """Undo a start: the enqueue may have run though its reply was lost, so the run
        leaves the queue too (else a worker would pop an id with no lease)."""
        keys = self._keys
        await self.redis.eval(
            _WITHDRAW,
            6,
            keys.leases,
            keys.jobs,
            keys.takers,
            keys.claim(session_id),
            keys.client(client),
            keys.queue,
            run_id,
        )

    async def _admit(self, session_id: str, run_id: str, client: str | None) -> None:
        keys = self._keys
        limit = self.client_runs if client is not None else 0
        hold = _ms(self.queue_timeout + self.lease)
        answer = _bytes(
            await self.redis.eval(
                _ADMIT,
                3,
                keys.claim(session_id),
                keys.queue,
                keys.client(client),
                run_id,
                hold,
                self.queue_max,
                limit,
            )
        )
        if answer == b"busy":
            raise SessionBusy(session_id)
        if answer == b"full":
            raise RunsFull(
                f"the run queue is full ({self.queue_max} runs wait for a worker); retry later",
                max(1.0, self.lease / 3),
            )
        if answer == b"client":
            raise TooManyRuns(
                f"too many runs from {client}: {self.client_runs} are queued or running "
                "already; wait for one to end",
                max(1.0, self.lease / 3),
            )

    async def _enqueue(
        self, request: RunRequest, session_id: str, run_id: str, client: str | None
    ) -> RunHandle:
        channel = self.channel_for_session(session_id)
        execution_id = request.execution_id or new_execution_id()
        handle = RunHandle(session_id, execution_id, channel, await self.position_of(channel))
        keys = self._keys
        queued = await self.redis.eval(
            _ENQUEUE,
            4,
            keys.claim(session_id),
            keys.jobs,
            keys.leases,
            keys.queue,
            run_id,
            _job(handle, resolve_mode(request, self.default_mode), run_id, client),
            _ms(self.queue_timeout),
        )
        if not queued:  # the claim expired while the position was read (Redis stalled)
            raise SessionBusy(session_id)
        return handle

    async def aclose(self, grace: float = 5.0) -> None:
        if self._reaping is not None:
            self._reaping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaping
        await self.reaper.aclose()
        await self.redis.aclose()


@dataclass
class Worker:
    """Takes queued runs off Redis and runs them, ``concurrency`` at a time, holding a
    lease on each (renewed every third of ``lease``), and ends runs of dead workers.

    Args:
        redis: the deployment's Redis (no socket timeout: BLPOP blocks).
        app_id: the app the runs belong to.
        prefix: the deployment's key prefix.
        concurrency: runs executed at the same time by this process.
        parts: the agents' driver factory and tools, and the router factory.
        state_ttl: seconds final states are kept for reconcile.
        lease: seconds this worker's hold on a run lasts unless renewed.
        max_run_seconds: seconds a run may last (None: no limit); one that reaches it
            is stopped and ends with a ``failed`` status that says so.
        worker_id: this worker's name in the logs of whoever ends its runs.
    """

    redis: RedisClient
    app_id: str
    prefix: str = DEFAULT_PREFIX
    concurrency: int = 8
    parts: DemoParts = field(default_factory=demo_parts)
    state_ttl: float = 86_400.0
    lease: float = LEASE
    max_run_seconds: float | None = None
    worker_id: str = field(default_factory=lambda: f"w-{secrets.token_hex(4)}")
    completed: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._slots = asyncio.Semaphore(self.concurrency)
        self._keys = _Keys(self.prefix, self.app_id)
        self._publisher = RedisPublisher(self.redis, self.app_id, prefix=self.prefix)
        self._runs = RunManager(
            publisher=self._publisher,
            state_store=RedisStateStore(
                self.redis, self.app_id, prefix=self.prefix, ttl=self.state_ttl
            ),
            driver_factory=self.parts.driver_factory,
            tools=self.parts.tools,
            router_factory=self.parts.router_factory,
            load_snapshot=self._load_snapshot,
            max_duration=self.max_run_seconds,
            max_duration_name="AGENT_WORKER_MAX_RUN_SECONDS",
        )
        self.reaper = Reaper(self.redis, self.app_id, self.prefix, self.state_ttl)

    async def _load_snapshot(self, channel: str) -> bytes | None:
        return await _load_snapshot(self.redis, self.prefix, self.app_id, channel)

    async def run_forever(self, stop: asyncio.Event) -> None:
        """Consume jobs until ``stop`` is set, then let running ones finish."""
        reaping = asyncio.get_running_loop().create_task(
            self.reaper.run_forever(self.lease / 3, stop)
        )
        while await self._slot(stop):
            try:
                item = await self.redis.blpop([self._keys.queue], timeout=1)
            except (RedisError, OSError) as exc:
                self._slots.release()
                logger.warning("cannot read the run queue (%s); retrying", exc)
                await _sleep_or_stop(stop, 1.0)
                continue
            if item is None:
                self._slots.release()
                continue
            task = asyncio.get_running_loop().create_task(self._take(_bytes(item[1])))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await reaping
        await self.reaper.aclose()
        await self._publisher.aclose()

    async def _slot(self, stop: asyncio.Event) -> bool:
        """Wait for a free slot and take it; False (holding none) once ``stop`` is set,
        even while every slot is busy."""
        if stop.is_set():
            return False
        if not self._slots.locked():
            return await self._slots.acquire()
        loop = asyncio.get_running_loop()
        acquiring = loop.create_task(self._slots.acquire())
        stopping = loop.create_task(stop.wait())
        held = False
        try:
            await asyncio.wait([acquiring, stopping], return_when=asyncio.FIRST_COMPLETED)
            held = not stop.is_set()
        finally:
            stopping.cancel()
            # cancel() is False once it acquired (a cancelled acquire gives back any slot)
            if not acquiring.cancel() and not held:
                self._slots.release()
        return held

    async def _take(self, queued: bytes) -> None:
        """Run the queued run whose id is ``queued``, if it can; then free its slot."""
        try:
            job = await self._lease(queued)
            if job is None:
                return
            try:
                await self._execute(job)
            finally:
                self.completed += 1
        finally:
            self._slots.release()

    async def _lease(self, queued: bytes) -> _Job | None:
        """Lease the queued run to this worker and return its job; None (logged) when it
        is not to run here."""
        try:
            run_id = queued.decode()
        except UnicodeDecodeError:
            logger.warning(
                "dropping a queued run id that is not UTF-8 (%d bytes): %r",
                len(queued),
                queued[:EXCERPT_LENGTH],
            )
            return None
        keys = self._keys
        try:
            raw = await self.redis.eval(
                _TAKE,
                3,
                keys.leases,
                keys.jobs,
                keys.takers,
                run_id,
                _ms(self.lease),
                self.worker_id,
            )
        except (RedisError, OSError) as exc:  # it ends failed after its deadline
            logger.error("cannot take run %s (%s)", excerpt(run_id), exc)
            return None
        if raw is None:
            logger.warning(
                "dropping queued run %s: it has no lease (it was ended while it waited, or "
                "its start was undone)",
                excerpt(run_id),
            )
            return None
        try:
            return _parse_job(_bytes(raw))
        except (ValueError, KeyError, TypeError, ValidationError) as exc:
            logger.error("dropping malformed run %s (%s)", excerpt(run_id), exc)
            return None

    async def _execute(self, job: _Job) -> None:
        loop = asyncio.get_running_loop()
        run = loop.create_task(self._runs.execute(job.handle, job.request))
        renewer = loop.create_task(self._renew(job, run))
        try:
            await asyncio.wait([run])  # ends when the run does, even if it was stopped
            await self._publisher.flush()
        finally:
            run.cancel()
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            with contextlib.suppress(RedisError, OSError):
                await _finish(self.redis, self._keys, job)

    async def _renew(self, job: _Job, run: asyncio.Task[Any]) -> None:
        """Renew the lease every third of it; stop the run if it is no longer ours (it
        was ended as abandoned: this worker stalled past its lease)."""
        keys = self._keys
        while True:
            await asyncio.sleep(self.lease / 3)
            try:
                held = await self.redis.eval(
                    _RENEW,
                    3,
                    keys.leases,
                    keys.claim(job.handle.session_id),
                    keys.client(job.client),
                    job.run_id,
                    _ms(self.lease),
                )
            except (RedisError, OSError) as exc:
                logger.warning("cannot renew the lease of run %s: %s", job.run_id, exc)
                continue
            if not held:
                logger.error("run %s was ended by another process; stopping it", job.run_id)
                run.cancel()
                return


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


class WorkerSettings(BaseSettings):
    """``agent-worker`` settings (``AGENT_WORKER_<FIELD>``; ``REDIS_URL`` also works)."""

    model_config = SettingsConfigDict(env_prefix="AGENT_WORKER_", extra="forbid")

    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0", pattern=r"^rediss?(-sentinel|-cluster)?://"
    )
    redis_prefix: str = Field(default=DEFAULT_PREFIX, min_length=1)
    app_id: str = Field(default="1", min_length=1)
    concurrency: int = Field(default=8, ge=1, le=1000)
    driver: Literal["scripted", "openai"] = "scripted"
    state_ttl: float = Field(default=86_400.0, gt=0)
    lease: float = Field(
        default=LEASE,
        ge=0.3,
        le=3600,
        description="seconds a worker's hold on a run lasts unless renewed (every third of "
        "it); a dead worker's run ends failed after it (plus up to a third of it)",
    )
    max_run_seconds: float = Field(
        default=300.0,
        gt=0,
        le=86_400,
        description="seconds a run may last; one that reaches it is stopped and ends "
        "failed, which frees its session",
    )


async def _serve(settings: WorkerSettings) -> None:
    redis = redis_client(settings.redis_url)  # redis://, redis-sentinel://, redis-cluster://
    await redis.ping()
    worker = Worker(
        redis,
        settings.app_id,
        prefix=settings.redis_prefix,
        concurrency=settings.concurrency,
        parts=demo_parts(settings.driver),
        state_ttl=settings.state_ttl,
        lease=settings.lease,
        max_run_seconds=settings.max_run_seconds,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(
        f"agent-worker ready: runs of app {settings.app_id!r} from "
        f"{display_url(settings.redis_url)} (prefix {settings.redis_prefix!r})",
        flush=True,
    )
    try:
        await worker.run_forever(stop)
    finally:
        await redis.aclose()


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop where it is installed (with uvicorn[standard], as the server runs):
    about a sixth less CPU per published envelope than the plain asyncio loop, in the
    bench's agent sessions. None (the plain loop) elsewhere."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


@click.command()
@click.option(
    "--redis",
    "redis_url",
    envvar="REDIS_URL",
    help="redis://host:port/db, redis-sentinel://host:port,host:port/service/db or "
    "redis-cluster://host:port,host:port/ (as the servers' --backend)",
)
@click.option("--redis-prefix", help="key prefix of the deployment [agentbc]")
@click.option("--app-id", help="app whose channels the runs publish on [1]")
@click.option("--concurrency", type=int, help="runs at the same time [8]")
@click.option("--driver", help="scripted | openai [scripted]")
@click.option("--lease", type=float, help="seconds a hold on a run lasts unless renewed [15]")
def main(**options: Any) -> None:
    """Run queued agent runs (the Procfile's `worker`)."""
    given = {k: v for k, v in options.items() if v is not None}
    try:
        settings = WorkerSettings(**given)
    except ValidationError as exc:
        raise click.ClickException(str(exc)) from None
    logging.basicConfig(level=logging.INFO)
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            runner.run(_serve(settings))
    except (RedisError, OSError) as exc:
        raise click.ClickException(f"cannot reach Redis: {exc}") from None


if __name__ == "__main__":
    main()
