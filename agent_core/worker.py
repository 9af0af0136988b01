"""The scaled-out shape: ``web`` only fans out, ``worker`` processes run the agents.

With ``AGENT_DEMO_RUN_MODE=queue`` the demo's ``POST /run`` does not run the agent in
the web process: :class:`RunQueue` claims the session (one run at a time, across every
process), reads the channel's position and queues the job in Redis. ``agent-worker``
(:class:`Worker`) takes jobs off that queue and runs them with a
:class:`~broadcaster.publishers.RedisPublisher` and a
:class:`~broadcaster.publishers.RedisStateStore`, i.e. along the Redis backend's own
path, so any server node subscribed to the session's channel delivers the envelopes and
serves the final state.

Redis keys (``P`` = prefix, ``A`` = app id)::

    P:A:runs                  list of queued jobs (JSON), RPUSH by web, BLPOP by workers
    P:A:run-lock:<session>    the session's claim (execution id), removed by the worker
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import click
import orjson
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict
from redis.asyncio import Redis
from redis.exceptions import RedisError

from agent_core.demo_routing import DemoParts, demo_parts
from agent_core.runs import (
    RunHandle,
    RunManager,
    RunMode,
    RunRequest,
    SessionBusy,
    new_execution_id,
    new_session_id,
    resolve_mode,
)
from broadcaster.backends.redis import DEFAULT_PREFIX, safe_url, value_key
from broadcaster.envelope import channel_for
from broadcaster.publishers import RedisPublisher, RedisStateStore, state_key

__all__ = ["LOCK_TTL", "RunQueue", "Worker", "WorkerSettings", "main"]

logger = logging.getLogger(__name__)

LOCK_TTL = 15 * 60.0
"""Seconds a session stays claimed if its worker dies without releasing it."""


def queue_key(prefix: str, app_id: str) -> str:
    return f"{prefix}:{app_id}:runs"


def lock_key(prefix: str, app_id: str, session_id: str) -> str:
    return f"{prefix}:{app_id}:run-lock:{session_id}"


def _job(handle: RunHandle, request: RunRequest) -> bytes:
    return orjson.dumps(
        {
            "session_id": handle.session_id,
            "execution_id": handle.execution_id,
            "channel": handle.channel,
            "position": handle.position,
            "request": request.model_dump(),
        }
    )


def _parse_job(raw: bytes) -> tuple[RunHandle, RunRequest]:
    data = orjson.loads(raw)
    handle = RunHandle(
        data["session_id"], data["execution_id"], data["channel"], data.get("position")
    )
    return handle, RunRequest.model_validate(data["request"])


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
    """

    redis: Redis
    app_id: str
    position_of: Callable[[str], Awaitable[str | None]]
    prefix: str = DEFAULT_PREFIX
    channel_for_session: Callable[[str], str] = channel_for
    default_mode: RunMode = "agent"

    def state_url(self, session_id: str) -> str:
        return f"/api/sessions/{session_id}/state"

    async def start(self, request: RunRequest) -> RunHandle:
        """Claim the session and queue the run.

        Raises:
            SessionBusy: another run of the session is queued or running.
            redis.exceptions.RedisError: Redis is unreachable.
        """
        session_id = request.session_id or new_session_id()
        execution_id = request.execution_id or new_execution_id()
        lock = lock_key(self.prefix, self.app_id, session_id)
        if not await self.redis.set(lock, execution_id, nx=True, px=int(LOCK_TTL * 1000)):
            raise SessionBusy(session_id)
        try:
            channel = self.channel_for_session(session_id)
            handle = RunHandle(session_id, execution_id, channel, await self.position_of(channel))
            job = _job(handle, resolve_mode(request, self.default_mode))
            await self.redis.rpush(queue_key(self.prefix, self.app_id), job)
        except BaseException:
            await self.redis.delete(lock)
            raise
        return handle

    async def aclose(self, grace: float = 5.0) -> None:
        await self.redis.aclose()


_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass
class Worker:
    """Takes queued runs off Redis and runs them, ``concurrency`` at a time.

    Args:
        redis: the deployment's Redis (no socket timeout: BLPOP blocks).
        app_id: the app the runs belong to.
        prefix: the deployment's key prefix.
        concurrency: runs executed at the same time by this process.
        parts: the agents' driver factory and tools, and the router factory.
        state_ttl: seconds final states are kept for reconcile.
    """

    redis: Redis
    app_id: str
    prefix: str = DEFAULT_PREFIX
    concurrency: int = 8
    parts: DemoParts = field(default_factory=demo_parts)
    state_ttl: float = 86_400.0
    completed: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._slots = asyncio.Semaphore(self.concurrency)
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
        )

    async def _load_snapshot(self, channel: str) -> bytes | None:
        key = value_key(self.prefix, self.app_id, state_key(channel))
        value: Any = await self.redis.get(key)
        return value if value is None or isinstance(value, bytes) else value.encode()

    async def run_forever(self, stop: asyncio.Event) -> None:
        """Consume jobs until ``stop`` is set, then let running ones finish."""
        key = queue_key(self.prefix, self.app_id)
        while not stop.is_set():
            await self._slots.acquire()
            try:
                item = await self.redis.blpop([key], timeout=1)
            except (RedisError, OSError) as exc:
                self._slots.release()
                logger.warning("cannot read the run queue (%s); retrying", exc)
                await _sleep_or_stop(stop, 1.0)
                continue
            if item is None:
                self._slots.release()
                continue
            raw = item[1]
            job = raw if isinstance(raw, bytes) else raw.encode()
            task = asyncio.get_running_loop().create_task(self._execute(job))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._publisher.aclose()

    async def _execute(self, raw: bytes) -> None:
        try:
            handle, request = _parse_job(raw)
        except (ValueError, KeyError, ValidationError) as exc:
            logger.error("dropping a malformed run job (%s): %r", exc, raw[:200])
            self._slots.release()
            return
        try:
            await self._runs.execute(handle, request)
            await self._publisher.flush()
        finally:
            lock = lock_key(self.prefix, self.app_id, handle.session_id)
            with contextlib.suppress(RedisError, OSError):
                await self.redis.eval(_RELEASE, 1, lock, handle.execution_id)
            self.completed += 1
            self._slots.release()


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


class WorkerSettings(BaseSettings):
    """``agent-worker`` settings (``AGENT_WORKER_<FIELD>``; ``REDIS_URL`` also works)."""

    model_config = SettingsConfigDict(env_prefix="AGENT_WORKER_", extra="forbid")

    redis_url: str = Field(default="redis://127.0.0.1:6379/0", pattern=r"^rediss?://")
    redis_prefix: str = Field(default=DEFAULT_PREFIX, min_length=1)
    app_id: str = Field(default="1", min_length=1)
    concurrency: int = Field(default=8, ge=1, le=1000)
    driver: Literal["scripted", "openai"] = "scripted"
    state_ttl: float = Field(default=86_400.0, gt=0)


async def _serve(settings: WorkerSettings) -> None:
    redis = Redis.from_url(settings.redis_url, socket_connect_timeout=5)
    await redis.ping()
    worker = Worker(
        redis,
        settings.app_id,
        prefix=settings.redis_prefix,
        concurrency=settings.concurrency,
        parts=demo_parts(settings.driver),
        state_ttl=settings.state_ttl,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(
        f"agent-worker ready: runs of app {settings.app_id!r} from "
        f"{safe_url(settings.redis_url)} (prefix {settings.redis_prefix!r})",
        flush=True,
    )
    try:
        await worker.run_forever(stop)
    finally:
        await redis.aclose()


@click.command()
@click.option("--redis", "redis_url", envvar="REDIS_URL", help="redis://host:port/db")
@click.option("--redis-prefix", help="key prefix of the deployment [agentbc]")
@click.option("--app-id", help="app whose channels the runs publish on [1]")
@click.option("--concurrency", type=int, help="runs at the same time [8]")
@click.option("--driver", help="scripted | openai [scripted]")
def main(**options: Any) -> None:
    """Run queued agent runs (the Procfile's `worker`)."""
    given = {k: v for k, v in options.items() if v is not None}
    try:
        settings = WorkerSettings(**given)
    except ValidationError as exc:
        raise click.ClickException(str(exc)) from None
    logging.basicConfig(level=logging.INFO)
    try:
        asyncio.run(_serve(settings))
    except (RedisError, OSError) as exc:
        raise click.ClickException(f"cannot reach Redis: {exc}") from None


if __name__ == "__main__":
    main()
