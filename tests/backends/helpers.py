"""Helpers for the backend tests: a recording node and condition polling."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from broadcaster.backends.base import Backend
from broadcaster.publication import Publication

APP = "app1"
OTHER_APP = "app2"


async def eventually(condition: Callable[[], bool], what: str, within: float = 10.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.005)


async def eventually_async(
    condition: Callable[[], Awaitable[bool]], what: str, within: float = 10.0
) -> None:
    """Poll the async ``condition`` until it holds; fail naming ``what`` after
    ``within`` seconds."""
    deadline = time.monotonic() + within
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.01)


@dataclass
class Node:
    """A started backend and what its handlers received."""

    backend: Backend
    publications: list[Publication] = field(default_factory=list)
    controls: list[tuple[str, Mapping[str, Any]]] = field(default_factory=list)

    def on_publication(self, publication: Publication) -> None:
        self.publications.append(publication)

    def on_control(self, app_id: str, message: Mapping[str, Any]) -> None:
        self.controls.append((app_id, message))

    def on(self, channel: str, app_id: str = APP) -> list[Publication]:
        """Publications received on ``channel`` of ``app_id``, in delivery order."""
        return [p for p in self.publications if p.channel == channel and p.app_id == app_id]

    async def wait_for(self, channel: str, count: int = 1, app_id: str = APP) -> None:
        await eventually(
            lambda: len(self.on(channel, app_id)) >= count,
            f"{count} publication(s) on {app_id}/{channel}",
        )

    async def fence(self, app_id: str = APP) -> None:
        """Publish a marker through this node and wait until it comes back: every
        publication sent before it on the same path has been delivered by then."""
        channel = "fence"
        await self.backend.subscribe(app_id, channel)
        before = len(self.on(channel, app_id))
        await self.backend.publish(Publication(app_id, channel, "fence", "{}"), history=False)
        await self.wait_for(channel, before + 1, app_id)
