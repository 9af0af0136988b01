"""A small SSE reader (the AG-UI and feed tests read streams with it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class SseEvent:
    """One server-sent event (or a comment line, with ``comment`` set)."""

    event: str = "message"
    data: str = ""
    id: str | None = None
    comment: str | None = None

    @property
    def json(self) -> Any:
        return json.loads(self.data)


@dataclass
class SseReader:
    """Parses an SSE response line by line (the EventSource algorithm, minus retry)."""

    response: httpx.Response
    _lines: AsyncIterator[str] = field(init=False)

    def __post_init__(self) -> None:
        self._lines = self.response.aiter_lines()

    async def next(self, within: float = 10) -> SseEvent:
        """The next event or comment."""
        return await asyncio.wait_for(self._next(), within)

    async def _next(self) -> SseEvent:
        event, data, seen = SseEvent(), [], False
        async for line in self._lines:
            if line == "":
                if seen:
                    event.data = "\n".join(data)
                    return event
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "":
                return SseEvent(comment=value)
            seen = True
            if name == "data":
                data.append(value)
            elif name == "event":
                event.event = value
            elif name == "id":
                event.id = value
        raise EOFError("the stream ended")

    async def events(self, within: float = 10) -> SseEvent:
        """The next event, skipping comments."""
        while True:
            item = await self.next(within)
            if item.comment is None:
                return item


@contextlib.asynccontextmanager
async def sse(url: str, headers: dict[str, str] | None = None) -> AsyncIterator[SseReader]:
    """Open an SSE stream (status 200 asserted) and read it."""
    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(10, read=None)) as http,
        http.stream("GET", url, headers=headers) as response,
    ):
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        yield SseReader(response)


def is_final(event: SseEvent) -> bool:
    """Whether ``event`` is a run's final agent.status."""
    return event.event == "agent.status" and event.json["payload"]["status"] in (
        "completed",
        "failed",
    )


async def read_until_final(reader: SseReader, stop_after: int | None = None) -> list[SseEvent]:
    """Envelope events until the final agent.status (or ``stop_after`` of them)."""
    found: list[SseEvent] = []
    while stop_after is None or len(found) < stop_after:
        event = await reader.events()
        if not event.event.startswith("agent."):
            continue
        found.append(event)
        if is_final(event):
            break
    return found
