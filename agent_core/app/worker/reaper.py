"""Ends runs past their deadline ``failed`` (see :mod:`agent_core.app.worker`)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from pydantic import ValidationError
from redis.exceptions import RedisError

from agent_core.app.runs import (
    end_abandoned,
)
from agent_core.app.worker._scripts import (
    _REAP,
    REAP_BATCH,
    _bytes,
    _finish,
    _Keys,
    _load_snapshot,
    _parse_job,
    _sleep_or_stop,
)
from broadcaster.backends.clients import RedisClient
from broadcaster.backends.redis import DEFAULT_PREFIX
from broadcaster.publishers import RedisPublisher, RedisStateStore

__all__ = ["Reaper"]

logger = logging.getLogger(__name__)


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
