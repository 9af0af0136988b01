"""Shared fixtures: a private Redis for the test session, real server processes, and
in-process servers with Pusher clients (helpers: the :mod:`tests.support` package)."""

from __future__ import annotations

import asyncio
import gc
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from broadcaster._uvicorn import protocol_class
from broadcaster.app import create_app
from broadcaster.backends.base import Backend
from broadcaster.node import Node
from broadcaster.server import http_protocol, ws_max_size
from broadcaster.settings import load_settings
from tests.support import quick
from tests.support.live import Client, LiveServer, QuietServer, StartServer, wait_for
from tests.support.openai_api import FakeChatAPI
from tests.support.processes import RedisServer, ServerFactory, ServerProcess
from tests.support.threaded import served_in_thread
from tests.support.topologies import ClusterTopology, SentinelTopology


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick",
        action="store_true",
        default=False,
        help="only the I/O-free unit tests (tests/support/quick.py): sockets and "
        "processes are refused",
    )


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if config.getoption("quick") and quick.outside_the_tier(collection_path):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("quick"):
        quick.select(config, items)


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Iterator[object]:
    if not session.config.getoption("quick"):
        return (yield)
    with quick.no_io():
        return (yield)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A private redis-server for the whole test session (do not kill it: use
    ``redis_factory`` for a Redis a test may kill and restart)."""
    server = RedisServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterTopology]:
    """A private 3-primary/3-replica Redis Cluster for the whole test session (tests
    that kill a node use their own, from ``ClusterTopology().start()``)."""
    cluster = ClusterTopology().start()
    yield cluster
    cluster.stop()


@pytest.fixture(autouse=True, scope="module")
def _collect_what_the_module_left() -> Iterator[None]:
    """Collect garbage after each module, so that a connection a module left open is
    reported (ResourceWarning, an error here) at that module's last test, not inside
    whichever test of another module the collector happens to run in."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[SentinelTopology]:
    """A private primary + replica watched by 3 Sentinels, for the whole session."""
    topology = SentinelTopology().start()
    yield topology
    topology.stop()


@pytest.fixture
def redis_factory() -> Iterator[Callable[[], RedisServer]]:
    """Start private redis-servers that the test owns (and may kill/restart)."""
    started: list[RedisServer] = []

    def start() -> RedisServer:
        server = RedisServer().start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def server_factory() -> Iterator[ServerFactory]:
    """Start ``python -m broadcaster serve`` processes; all are stopped afterwards."""
    started: list[ServerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> ServerProcess:
        proc = ServerProcess(args, env=env).start()
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()


@pytest.fixture
def server(server_factory: ServerFactory) -> ServerProcess:
    """One server on the in-memory backend."""
    return server_factory()


@pytest.fixture
async def start_server() -> AsyncIterator[StartServer]:
    """Start in-process servers with settings overrides; all are stopped afterwards."""
    started: list[LiveServer] = []

    async def start(
        ws: Any = None,
        backend_object: Backend | None = None,
        http: Any = None,
        **overrides: Any,
    ) -> LiveServer:
        """``ws`` names another uvicorn WebSocket implementation (no fast path), ``http``
        another HTTP one (no guard); ``backend_object`` replaces the backend the settings
        name."""
        settings = load_settings(port=0, log_level="warning", **overrides)
        node = Node(settings, backend=backend_object)
        config = uvicorn.Config(
            create_app(settings, node),
            http=http or http_protocol(settings),
            ws=ws or protocol_class(shutdown_abort_after=1.0),
            ws_per_message_deflate=False,
            ws_max_size=ws_max_size(settings),
            lifespan="on",
            log_level="warning",
            timeout_graceful_shutdown=3,
        )
        server = QuietServer(config)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        task = asyncio.create_task(server.serve(sockets=[sock]))
        await wait_for(lambda: server.started or task.done(), "the server to start")
        if task.done():
            sock.close()
            task.result()
        live = LiveServer(f"http://127.0.0.1:{port}", node, server, task)
        started.append(live)
        return live

    yield start
    for live in started:
        if not live.task.done():
            await live.stop()


@pytest.fixture
async def live(start_server: StartServer) -> LiveServer:
    """One in-process server with the default app and the memory backend."""
    return await start_server()


@pytest.fixture
async def clients() -> AsyncIterator[Callable[..., Awaitable[Client]]]:
    """Connect Pusher clients; all are closed afterwards."""
    opened: list[Client] = []

    async def connect(url: str, **kwargs: Any) -> Client:
        client = await Client.connect(url, **kwargs)
        opened.append(client)
        return client

    yield connect
    for client in opened:
        await client.close()


@pytest.fixture(scope="module")
def api() -> Iterator[FakeChatAPI]:
    """The fake API, served by uvicorn in a background thread for this module."""
    fake = FakeChatAPI()
    with served_in_thread(fake.app(), "fake API") as port:
        fake.port = port
        yield fake
