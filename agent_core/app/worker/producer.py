"""The web side: :class:`RunQueue` claims a session and queues its run for the
workers (see :mod:`agent_core.app.worker`)."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from redis.exceptions import RedisError

from agent_core.app.runs import (
    ClientRateLimit,
    RunHandle,
    RunMode,
    RunRequest,
    RunsFull,
    SessionBusy,
    TooManyRuns,
    check_new_execution,
    new_execution_id,
    new_session_id,
    resolve_mode,
)
from agent_core.app.worker._scripts import (
    _ADMIT,
    _ENQUEUE,
    _WITHDRAW,
    LEASE,
    QUEUE_TIMEOUT,
    _bytes,
    _job,
    _Keys,
    _ms,
)
from agent_core.app.worker.reaper import Reaper
from broadcaster.backends.clients import RedisClient
from broadcaster.backends.redis import DEFAULT_PREFIX
from broadcaster.envelope import channel_for
from broadcaster.publishers import RedisStateStore

__all__ = ["RunQueue"]


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
        self._runs = RedisStateStore(self.redis, self.app_id, prefix=self.prefix).runs

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
            ExecutionTaken: the request's ``execution_id`` is a recorded run of the
                session.
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
        await check_new_execution(self._runs, session_id, channel, request.execution_id)
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
