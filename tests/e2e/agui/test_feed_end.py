"""A stream whose feed ends (too slow, or the server shutting down) first sends what the
feed handed over with the end: that batch may hold the run's last envelopes, and
dropping it reported a completed run as "fell behind"."""

from __future__ import annotations

from typing import Any

from agent_core.app import agui, vercel_ai
from broadcaster import envelope as env
from broadcaster.sse import FeedItem

IDS = {"session_id": "v-1", "execution_id": "x-1"}


def item(offset: int, envelope: env.Envelope) -> FeedItem:
    return FeedItem(envelope.type, envelope.to_json().decode(), f"e1:{offset}")


RUN = [
    item(1, env.AgentStatus(**IDS, payload=env.StatusPayload(status="in_progress"))),
    item(2, env.StreamChunk(**IDS, payload=env.StreamChunkPayload(chunk="Hi", step_number=1))),
    item(3, env.AgentStatus(**IDS, payload=env.StatusPayload(status="completed"))),
]


class EndingFeed:
    """Hands over ``items`` in one batch, and is ended as it does."""

    channel = "agent.v-1"

    def __init__(self, items: list[FeedItem]) -> None:
        self.items = items
        self.ended: str | None = None

    async def receive(self, wait: float) -> list[FeedItem]:
        batch, self.items = self.items, []
        self.ended = "the server is shutting down"
        return batch


async def no_state(*_: Any) -> None:
    return None


async def test_the_vercel_stream_sends_the_batch_that_came_with_the_end() -> None:
    feed = EndingFeed(RUN)
    body = vercel_ai._chunks(feed, {}, "x-1", no_state, 1.0)  # type: ignore[arg-type]
    text = b"".join([part async for part in body]).decode()
    assert '"type":"text-delta"' in text
    assert '{"type":"finish","finishReason":"stop"}' in text
    assert "fell behind" not in text
    assert text.endswith("data: [DONE]\n\n")


async def test_the_vercel_stream_still_says_it_fell_behind_when_the_run_is_not_over() -> None:
    feed = EndingFeed(RUN[:2])
    body = vercel_ai._chunks(feed, {}, "x-1", no_state, 1.0)  # type: ignore[arg-type]
    text = b"".join([part async for part in body]).decode()
    assert text.index('"type":"text-delta"') < text.index("fell behind the run")


async def test_the_ag_ui_stream_sends_the_batch_that_came_with_the_end() -> None:
    feed = EndingFeed(RUN)
    mapper = agui.AguiMapper("v-1", "r-1")
    body = agui._events(feed, mapper, "x-1", no_state, 1.0)  # type: ignore[arg-type]
    text = b"".join([part async for part in body]).decode()
    assert "RUN_FINISHED" in text
    assert "RUN_ERROR" not in text
