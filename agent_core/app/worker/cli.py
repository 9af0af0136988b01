"""``agent-worker``: settings, start-up and the command line (see
:mod:`agent_core.app.worker`)."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from typing import Any, Literal

import click
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict
from redis.exceptions import RedisError

from agent_core.app.demo_routing import demo_parts
from agent_core.app.worker._scripts import LEASE
from agent_core.app.worker.consumer import Worker
from broadcaster.backends.clients import display_url, redis_client
from broadcaster.backends.redis import DEFAULT_PREFIX

__all__ = ["WorkerSettings", "event_loop_factory", "main"]


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
