"""One matrix per backend for the module that asks for it: the servers started and
every kind's run produced once, then read by each surface as its cells ask."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.support.conformance import Matrix
from tests.support.matrix import KINDS, produce, start_servers
from tests.support.openai_api import FakeChatAPI
from tests.support.processes import RedisServer


def _matrix(backend: str, redis_url: str | None, api: FakeChatAPI | None) -> Iterator[Matrix]:
    servers = start_servers(backend, redis_url, api)
    try:
        kinds = [kind for kind in KINDS if backend in kind.backends]
        yield Matrix(backend, asyncio.run(produce(servers, kinds)))
    finally:
        servers.stop()


@pytest.fixture(scope="module")
def memory_matrix(api: FakeChatAPI) -> Iterator[Matrix]:
    yield from _matrix("memory", None, api)


@pytest.fixture(scope="module")
def redis_matrix(redis_server: RedisServer) -> Iterator[Matrix]:
    yield from _matrix("redis", redis_server.url, None)
