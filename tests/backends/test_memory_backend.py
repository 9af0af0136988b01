"""What is particular to the in-memory backend: synchronous delivery, one node, an epoch
per process, validated options."""

from __future__ import annotations

import pytest

from broadcaster.backends import create_backend
from broadcaster.backends.memory import MemoryBackend
from broadcaster.publication import Position, Publication
from tests.backends.helpers import APP, Node


class MemoryNode(Node):
    backend: MemoryBackend


async def started(**options: object) -> MemoryNode:
    node = MemoryNode(MemoryBackend(**options))  # type: ignore[arg-type]
    await node.backend.start(node.on_publication, node.on_control)
    return node


async def test_create_backend_builds_a_memory_backend_with_options() -> None:
    backend = create_backend("memory://", history_size=5, history_ttl=1.5, apps=["a"])
    assert isinstance(backend, MemoryBackend)
    assert (backend.history_size, backend.history_ttl) == (5, 1.5)


async def test_the_handler_runs_before_publish_returns() -> None:
    node = await started()
    await node.backend.subscribe(APP, "chat")

    position = await node.backend.publish(Publication(APP, "chat", "e", "{}"))

    assert [p.position for p in node.publications] == [position]
    await node.backend.stop()


async def test_a_restarted_node_cannot_resume_positions_of_the_old_one() -> None:
    old = await started()
    position = await old.backend.publish(Publication(APP, "chat", "e", "{}"))
    await old.backend.stop()
    new = await started()
    assert position is not None

    result = await new.backend.history(APP, "chat", position)

    assert not result.recovered
    assert result.position is None, "the new node has no history of the channel"
    await new.backend.stop()


async def test_a_forgotten_channel_gets_a_new_epoch() -> None:
    now = [0.0]
    node = await started(history_ttl=10, history_meta_ttl=20, clock=lambda: now[0])
    position = await node.backend.publish(Publication(APP, "chat", "e", "{}"))
    assert position is not None

    now[0] = 25.0
    node.backend._sweep()

    assert node.backend._streams == {}
    fresh = await node.backend.position(APP, "chat")
    assert fresh.offset == 0
    assert fresh.epoch != position.epoch
    assert not (await node.backend.history(APP, "chat", position)).recovered
    await node.backend.stop()


async def test_the_sweep_drops_expired_history_but_keeps_the_epoch() -> None:
    now = [0.0]
    node = await started(history_ttl=10, history_meta_ttl=20, clock=lambda: now[0])
    position = await node.backend.publish(Publication(APP, "chat", "e", "{}"))
    assert position is not None

    now[0] = 15.0
    node.backend._sweep()

    assert await node.backend.position(APP, "chat") == position
    result = await node.backend.history(APP, "chat", Position(0, position.epoch))
    assert not result.recovered
    await node.backend.stop()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"history_size": 0}, "history_size must be at least 1, got 0"),
        ({"history_ttl": 0}, "history_ttl must be a positive number of seconds, got 0"),
        ({"history_ttl": 10, "history_meta_ttl": 5}, "must be at least history_ttl"),
    ],
)
def test_invalid_options_are_named(options: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MemoryBackend(**options)  # type: ignore[arg-type]
