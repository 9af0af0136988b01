"""The worker side: :class:`Worker` takes queued runs and runs them under a renewed
lease (see :mod:`agent_core.app.worker`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from redis.exceptions import RedisError

from agent_core.app.demo_routing import DemoParts, demo_parts
from agent_core.app.runs import (
    RunManager,
)
from agent_core.app.worker._scripts import (
    _RENEW,
    _TAKE,
    LEASE,
    _bytes,
    _finish,
    _Job,
    _Keys,
    _load_snapshot,
    _ms,
    _parse_job,
    _sleep_or_stop,
)
from agent_core.app.worker.reaper import Reaper
from broadcaster._text import EXCERPT_LENGTH, excerpt
from broadcaster.backends.clients import RedisClient
from broadcaster.backends.redis import DEFAULT_PREFIX
from broadcaster.publishers import RedisPublisher, RedisStateStore

__all__ = ["Worker"]

logger = logging.getLogger(__name__)


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
