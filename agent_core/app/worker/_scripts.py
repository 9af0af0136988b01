"""The run queue in Redis: its keys, its Lua scripts (each one atomic step on the
app's slot) and the job format, shared by the producer, the consumer and the reaper
(see :mod:`agent_core.app.worker`)."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

import orjson

from agent_core.app.runs import (
    RunHandle,
    RunRequest,
    run_claim,
)
from broadcaster.backends.clients import RedisClient
from broadcaster.backends.redis import claim_key, value_key
from broadcaster.publishers import state_key

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


async def _load_snapshot(
    redis: RedisClient, prefix: str, app_id: str, channel: str
) -> bytes | None:
    value: Any = await redis.get(value_key(prefix, app_id, state_key(channel)))
    return None if value is None else _bytes(value)


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
