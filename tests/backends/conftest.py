"""The backend factory: every conformance test runs once per backend.

``memory`` is single-node (one process holds everything), so tests that need two nodes
are deselected for it; ``redis``, ``redis-cluster`` and ``redis-sentinel`` nodes are
separate backends sharing the session's private Redis (a standalone one, a 3-primary /
3-replica cluster, a primary + replica behind 3 Sentinels) under a prefix unique to the
test, as separate processes would.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from broadcaster.backends import create_backend
from tests.backends.helpers import APP, OTHER_APP, Node


class BackendFactory:
    """Starts backends of one kind (``memory``, ``redis``, ``redis-cluster``,
    ``redis-sentinel``) as nodes of one deployment."""

    def __init__(self, kind: str, url: str) -> None:
        self.kind = kind
        self.url = url
        self.prefix = f"test-{uuid.uuid4().hex[:12]}"
        self.nodes: list[Node] = []

    @property
    def multi_node(self) -> bool:
        return self.kind != "memory"

    async def node(self, **options: Any) -> Node:
        """A started node; ``options`` go to the backend's constructor."""
        options.setdefault("apps", (APP, OTHER_APP))
        if self.kind != "memory":
            options.setdefault("prefix", self.prefix)
        node = Node(create_backend(self.url, **options))
        await node.backend.start(node.on_publication, node.on_control)
        self.nodes.append(node)
        return node

    async def close(self) -> None:
        for node in self.nodes:
            await node.backend.stop()


_TOPOLOGY = {
    "redis": "redis_server",
    "redis-cluster": "redis_cluster",
    "redis-sentinel": "redis_sentinel",
}


def _url(kind: str, request: pytest.FixtureRequest) -> str:
    if kind == "memory":
        return "memory://"
    server = request.getfixturevalue(_TOPOLOGY[kind])
    url: str = server.url
    return url


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("redis-cluster", marks=pytest.mark.redis),
        pytest.param("redis-sentinel", marks=pytest.mark.redis),
    ]
)
async def backend_factory(request: pytest.FixtureRequest) -> AsyncIterator[BackendFactory]:
    factory = BackendFactory(request.param, _url(request.param, request))
    yield factory
    await factory.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``multi_node`` do not apply to the memory backend (its instances
    share nothing): they are deselected for it rather than skipped, so a run with
    ``CI=true`` shows no skip."""
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        single = callspec is not None and callspec.params.get("backend_factory") == "memory"
        (drop if single and item.get_closest_marker("multi_node") else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
