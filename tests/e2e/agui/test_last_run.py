"""A session's last run as the AG-UI and Vercel doors find it: read backwards from the
channel's top (or from a position) in pages, past runs longer than one page."""

from __future__ import annotations

from agent_core.app._streams import LastRun, last_run
from broadcaster import envelope as env
from broadcaster.backends.memory import MemoryBackend
from broadcaster.publication import Position, Publication

APP_ID = "1"
CHANNEL = "agent.s-1"


async def published(backend: MemoryBackend, execution_id: str, status: str | None) -> Position:
    """One envelope of ``execution_id``: its status, or a stream chunk (None)."""
    ids = {"session_id": "s-1", "execution_id": execution_id}
    if status is None:
        envelope: env.Envelope = env.StreamChunk(**ids, payload=env.StreamChunkPayload(chunk="x"))
    else:
        envelope = env.AgentStatus(**ids, payload=env.StatusPayload(status=status))  # type: ignore[arg-type]
    data = envelope.to_json().decode()
    position = await backend.publish(Publication(APP_ID, CHANNEL, envelope.type, data))
    assert position is not None
    return position


async def noop(*_: object) -> None:
    return None


async def test_the_last_run_is_found_past_runs_longer_than_a_page() -> None:
    backend = MemoryBackend(history_size=1000)
    await backend.start(noop, noop)  # type: ignore[arg-type]
    try:
        await published(backend, "x-1", "in_progress")
        for _ in range(150):
            await published(backend, "x-1", None)
        done = await published(backend, "x-1", "completed")
        start = await published(backend, "x-2", "in_progress")
        for _ in range(250):  # two and a half pages back to its start
            middle = await published(backend, "x-2", None)
        before = Position(start.offset - 1, start.epoch)
        assert await last_run(backend, APP_ID, CHANNEL, 1000) == LastRun("x-2", True, before)
        # As of a position: the run going there, or the one that had ended by then.
        assert await last_run(backend, APP_ID, CHANNEL, 1000, until=middle) == LastRun(
            "x-2", True, before
        )
        assert await last_run(backend, APP_ID, CHANNEL, 1000, until=done) == LastRun(
            "x-1", going=False
        )
        # Its start beyond the reach: going, start unknown.
        assert await last_run(backend, APP_ID, CHANNEL, 100) == LastRun("x-2", True)
        other_epoch = Position(middle.offset, "another")
        assert await last_run(backend, APP_ID, CHANNEL, 1000, until=other_epoch) is None
        await published(backend, "x-2", "failed")
        assert await last_run(backend, APP_ID, CHANNEL, 1000) == LastRun("x-2", going=False)
    finally:
        await backend.stop()
