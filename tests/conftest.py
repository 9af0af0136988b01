"""Shared fixtures: a private Redis for the test session and real server processes
(helpers: the :mod:`tests.support` package)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.support.processes import RedisServer, ServerFactory, ServerProcess
from tests.support.topologies import ClusterTopology, SentinelTopology


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
