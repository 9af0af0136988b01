"""``agent-worker`` as a child process, and a queue with a worker consuming it in this
process (the scaled-out run shape)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from typing import Any

from redis.asyncio import Redis

from agent_core.app.worker import RunQueue, Worker
from tests.support.processes import REPO, RedisServer

PREFIX = "wire-worker"


class WorkerProcess:
    """``python -m agent_core.app.worker`` in a child process (ready when it says so)."""

    def __init__(
        self, redis_url: str, prefix: str = PREFIX, env: dict[str, str] | None = None
    ) -> None:
        args = ["--redis", redis_url, "--redis-prefix", prefix, "--concurrency", "4"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agent_core.app.worker", *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("agent-worker ready"):
                self.ready.set()

    def started(self) -> WorkerProcess:
        assert self.ready.wait(20), "".join(self.lines)
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash (or the OOM killer) would."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._close()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(15)
        self._close()
        return code

    def _close(self) -> None:
        self._drainer.join(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@contextlib.asynccontextmanager
async def consuming_worker(
    redis_server: RedisServer, prefix: str, **options: Any
) -> AsyncIterator[tuple[Redis, RunQueue, Worker]]:
    """A queue and a worker with ``options`` consuming it, on ``prefix``; stopped (its
    runs finished) and closed afterwards."""
    redis = Redis.from_url(redis_server.url)

    async def no_position(channel: str) -> None:
        return None

    queue = RunQueue(Redis.from_url(redis_server.url), "1", no_position, prefix=prefix)
    worker = Worker(redis, "1", prefix=prefix, **options)
    stop = asyncio.Event()
    consuming = asyncio.create_task(worker.run_forever(stop))
    try:
        yield redis, queue, worker
    finally:
        stop.set()
        await consuming
        await queue.aclose()
        await redis.aclose()
