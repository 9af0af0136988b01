"""The event dispatcher: buffering, typed subscriptions, sync/async, failures."""

from __future__ import annotations

import logging

import pytest

from agent_core.events import (
    AgentEvent,
    EventDispatcher,
    StateUpdated,
    StreamChunk,
    ToolCallStarted,
)
from agent_core.state import AgentState
from tests.support.factories import T0


def chunk(index: int) -> StreamChunk:
    return StreamChunk(
        agent_id="a",
        execution_id="x",
        occurred_at=T0,
        step_number=1,
        text_delta=f"t{index}",
        chunk_index=index,
        is_complete=False,
    )


async def test_typed_listeners_receive_only_their_events_in_order() -> None:
    events = EventDispatcher()
    chunks: list[StreamChunk] = []
    everything: list[AgentEvent] = []
    events.on(StreamChunk, chunks.append)
    events.listen(everything.append)
    events.emit(chunk(0))
    events.emit(
        ToolCallStarted(
            agent_id="a", execution_id="x", occurred_at=T0, step_number=1,
            tool_call_id="c", tool_name="t", args={},
        )
    )  # fmt: skip
    events.emit(chunk(1))
    assert everything == []
    await events.flush()
    assert [c.chunk_index for c in chunks] == [0, 1]
    assert len(everything) == 3
    assert events.pending == 0


async def test_failing_listeners_are_logged_and_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    events = EventDispatcher()
    got: list[int] = []

    def broken(event: AgentEvent) -> None:
        raise ValueError("nope")

    async def later(event: AgentEvent) -> None:
        got.append(1)

    events.listen(broken)
    events.listen(later)
    events.emit(chunk(0))
    with caplog.at_level(logging.ERROR, logger="agent_core.events"):
        await events.flush()
    assert got == [1]
    assert "event listener" in caplog.text
    assert "the run goes on" in caplog.text


def test_payload_is_plain_data_without_envelope_fields() -> None:
    payload = chunk(3).payload()
    assert payload == {"step_number": 1, "text_delta": "t3", "chunk_index": 3, "is_complete": False}
    assert chunk(3).type == "agent.stream.chunk"
    updated = StateUpdated(agent_id="a", execution_id=None, occurred_at=T0, state=AgentState())
    assert updated.payload()["status"] == "pending"
