"""A run's final agent.status says "you may start the next run": a start that comes right
after it must wait for the run's last steps (delivery, the run index, the claim's
release), not be refused as busy."""

from __future__ import annotations

import asyncio

import pytest

from agent_core.app.demo_tools import demo_driver
from agent_core.app.runs import PacedDriver, RunManager, RunRequest, SessionBusy
from broadcaster.envelope import Envelope
from broadcaster.publishers import RecordingPublisher


class FinalSeen(RecordingPublisher):
    """Records envelopes; ``final`` is set once a final agent.status is published."""

    def __init__(self) -> None:
        super().__init__()
        self.final = asyncio.Event()

    async def broadcast(self, channel: str, envelope: Envelope) -> None:
        await super().broadcast(channel, envelope)
        if envelope.type == "agent.status" and envelope.payload.status in (  # type: ignore[union-attr]
            "completed",
            "failed",
        ):
            self.final.set()


class Store:
    def __init__(self) -> None:
        self.saved: dict[str, bytes] = {}

    async def save(self, channel: str, snapshot: bytes) -> None:
        self.saved[channel] = snapshot


class SlowRelease:
    """Claims whose release takes a while, as a Redis round trip under load does."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.held: dict[str, str] = {}

    async def claim(self, session_id: str, owner: str, ttl: float) -> bool:
        return self.held.setdefault(session_id, owner) == owner

    async def release(self, session_id: str, owner: str) -> None:
        await asyncio.sleep(self.delay)
        if self.held.get(session_id) == owner:
            del self.held[session_id]


def _manager(publisher: FinalSeen, claims: SlowRelease, pace: float = 0.0) -> RunManager:
    return RunManager(
        publisher=publisher,
        state_store=Store(),
        driver_factory=(lambda text: PacedDriver(demo_driver(text), pace)) if pace else demo_driver,
        claims=claims,
    )


async def test_a_start_right_after_the_final_status_waits_for_the_run_to_end() -> None:
    publisher, claims = FinalSeen(), SlowRelease(0.3)
    manager = _manager(publisher, claims)
    first = await manager.start(RunRequest(input="What is 6 * 7?", session_id="s-next"))
    await asyncio.wait_for(publisher.final.wait(), 10)
    assert manager.running("s-next"), "the run is still in its last steps"
    second = await manager.start(RunRequest(input="And 7 * 8?", session_id="s-next"))
    assert second.execution_id != first.execution_id
    await manager.wait("s-next")
    assert claims.held == {}


async def test_a_start_during_a_run_is_still_refused_at_once() -> None:
    publisher, claims = FinalSeen(), SlowRelease(0.0)
    manager = _manager(publisher, claims, pace=0.05)
    await manager.start(RunRequest(input="What is the weather in Oslo?", session_id="s-busy"))
    await asyncio.sleep(0.05)
    with pytest.raises(SessionBusy):
        await manager.start(RunRequest(input="again", session_id="s-busy"))
    assert not publisher.final.is_set()
    await manager.wait("s-busy")


async def test_a_final_state_json_cannot_carry_is_stored_failed_and_the_end_says_so() -> None:
    """A run's end is always published: a final state orjson cannot write (a model's
    text with a lone surrogate, from a driver that does not clean it) is stored
    ``failed`` with that text replaced, and the final status says why and where it is
    (before, the status said completed and the state was missing, 404)."""
    import orjson

    from agent_core.drivers.scripted import ScriptedDriver, ScriptedResponse

    publisher, store = FinalSeen(), Store()
    manager = RunManager(
        publisher=publisher,
        state_store=store,
        driver_factory=lambda text: ScriptedDriver([ScriptedResponse(text="half \ud800 a pair")]),
    )
    await manager.start(RunRequest(input="hi", session_id="s-bad"))
    await manager.wait("s-bad")
    final = publisher.envelopes()[-1].payload
    assert (final.status, final.stop_reason) == ("failed", "error")  # type: ignore[union-attr]
    assert "held what JSON cannot carry" in final.error_message  # type: ignore[union-attr]
    assert final.state_url == "/api/sessions/s-bad/state"  # type: ignore[union-attr]
    stored = orjson.loads(store.saved["agent.s-bad"])
    assert stored["status"] == "failed"
    assert stored["error_message"] == final.error_message  # type: ignore[union-attr]
    assert "half \ufffd a pair" in [m["content"] for m in stored["messages"]]
