"""agent-worker and the ids in the run queue: one it cannot run (no lease, not UTF-8) is
dropped with a warning and frees its slot, and a busy worker stops when asked."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from agent_core.app.runs import RunRequest
from agent_core.app.worker import RunQueue, Worker
from broadcaster.publishers import state_key
from tests.support.processes import RedisServer
from tests.support.reliability import eventually
from tests.support.worker import consuming_worker

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def dropped(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.getMessage().startswith("dropping")
    ]


async def forget(redis: Redis, prefix: str) -> None:
    keys = [k async for k in redis.scan_iter(f"{prefix}:*")]
    if keys:
        await redis.delete(*keys)


async def test_queued_ids_without_a_lease_free_their_slots(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """More lease-less ids than slots (as a run ended while queued leaves them): each is
    dropped with a warning that names it, and a real run after them still completes."""
    prefix = "wire-no-lease"
    caplog.set_level(logging.WARNING, logger="agent_core.app.worker")
    async with consuming_worker(redis_server, prefix, concurrency=2) as (redis, queue, worker):
        ghosts = [f"deadbeef0000000{n}" for n in range(5)]
        await redis.rpush(f"{prefix}:{{1}}:runs", *ghosts)
        run = await queue.start(RunRequest(input="Weather in Oslo?"))

        await eventually(lambda: worker.completed == 1, "the worker to run the real run")
        assert await redis.get(f"{prefix}:1:value:{state_key(run.channel)}") is not None
    messages = dropped(caplog)
    assert len(messages) == len(ghosts)
    for ghost in ghosts:
        assert any(ghost in m and "no lease" in m for m in messages), messages


async def test_a_run_id_that_is_not_utf8_is_dropped(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """It does not end the worker: it is logged and dropped, and the next run completes."""
    prefix = "wire-not-utf8"
    caplog.set_level(logging.WARNING, logger="agent_core.app.worker")
    async with consuming_worker(redis_server, prefix, concurrency=1) as (redis, queue, worker):
        await redis.rpush(f"{prefix}:{{1}}:runs", b"\xff\xfe")
        run = await queue.start(RunRequest(input="Weather in Oslo?"))

        await eventually(lambda: worker.completed == 1, "the worker to run the real run")
        assert await redis.get(f"{prefix}:1:value:{state_key(run.channel)}") is not None
    assert [m for m in dropped(caplog) if "not UTF-8" in m and r"\xff\xfe" in m]


@pytest.mark.timeout(30)
async def test_a_worker_with_every_slot_busy_stops_when_asked(redis_server: RedisServer) -> None:
    """It stops waiting for a slot: its running run finishes, the queued one stays queued
    for another worker."""
    prefix = "wire-busy-stop"
    redis = Redis.from_url(redis_server.url)

    async def no_position(channel: str) -> None:
        return None

    queue = RunQueue(Redis.from_url(redis_server.url), "1", no_position, prefix=prefix)
    worker = Worker(redis, "1", prefix=prefix, concurrency=1)
    stop = asyncio.Event()
    consuming = asyncio.create_task(worker.run_forever(stop))
    try:
        await queue.start(RunRequest(input="Weather in Oslo?", pace_ms=100))
        takers = f"{prefix}:{{1}}:run-takers"
        await eventually(lambda: redis.hlen(takers), "the worker to take the first run")
        waiting = await queue.start(RunRequest(input="Weather in Lima?"))

        stop.set()
        await consuming

        assert worker.completed == 1
        assert await redis.llen(f"{prefix}:{{1}}:runs") == 1
        assert await redis.exists(f"{prefix}:{{1}}:claim:run:{waiting.session_id}") == 1
    finally:
        stop.set()
        await consuming
        await forget(redis, prefix)
        await queue.aclose()
        await redis.aclose()


async def test_an_undone_start_leaves_nothing_in_the_queue(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The enqueue ran but its reply was lost: the start fails, and its run id leaves the
    queue with its lease, so no worker pops an id that has none."""
    prefix = "wire-undone-start"
    redis = Redis.from_url(redis_server.url)

    async def no_position(channel: str) -> None:
        return None

    queue = RunQueue(redis, "1", no_position, prefix=prefix)
    real_eval = redis.eval

    async def reply_lost(script: str, numkeys: int, *args: Any) -> Any:
        answer = await real_eval(script, numkeys, *args)
        if "RPUSH" in script:
            raise RedisConnectionError("the connection closed before the reply")
        return answer

    monkeypatch.setattr(redis, "eval", reply_lost)
    try:
        with pytest.raises(RedisConnectionError):
            await queue.start(RunRequest(input="Weather in Oslo?", session_id="undone"))
        assert await redis.llen(f"{prefix}:{{1}}:runs") == 0
        assert await redis.zcard(f"{prefix}:{{1}}:run-leases") == 0
        assert await redis.hlen(f"{prefix}:{{1}}:run-jobs") == 0
        assert await redis.exists(f"{prefix}:{{1}}:claim:run:undone") == 0
    finally:
        await forget(redis, prefix)
        await queue.aclose()
