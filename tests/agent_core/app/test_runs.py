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
