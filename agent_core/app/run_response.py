"""``POST /run`` with ``"wait": true``: answer when the run ends, with the routing
design's ``RunResponse`` (the final output, the capability result, metadata with
timing), bounded by ``wait_seconds``.

The wait follows the run's channel from the position handed out for it (a
:class:`~broadcaster.sse.ChannelFeed`, as an SSE client would), so it works wherever
the run executes (this process, or an ``agent-worker`` in queue mode), then reads the
state the run stored before its final ``agent.status``.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from agent_core.app.runs import RunHandle
from broadcaster.backends import BackendUnavailable
from broadcaster.node import Node
from broadcaster.publication import Position
from broadcaster.publishers import state_key
from broadcaster.settings import AppConfig
from broadcaster.sse import ChannelFeed, is_final_status

__all__ = ["FeedEnded", "final_status", "run_response", "timed_out", "wait_or_note"]


class FeedEnded(Exception):
    """The channel's feed ended before the run did (the server is shutting down, or
    the feed fell too far behind)."""


async def final_status(
    node: Node, app: AppConfig, handle: RunHandle, seconds: float
) -> dict[str, Any] | None:
    """The payload of the run's final ``agent.status``, or None if it did not come
    within ``seconds``.

    Raises:
        BackendUnavailable: the channel cannot be followed.
        FeedEnded: the feed ended first (its reason is the message).
    """
    since = None if handle.position is None else Position.parse(handle.position)
    deadline = time.monotonic() + seconds
    async with ChannelFeed(node, app, handle.channel, since) as feed:
        while (left := deadline - time.monotonic()) > 0:
            for item in await feed.receive(left):
                if not is_final_status(item):
                    continue
                envelope = orjson.loads(item.data)
                if envelope.get("execution_id") == handle.execution_id:
                    payload: dict[str, Any] = envelope["payload"]
                    return payload
            if feed.ended is not None:
                raise FeedEnded(feed.ended)
    return None


async def run_response(
    node: Node,
    app: AppConfig,
    handle: RunHandle,
    mode: str,
    status: dict[str, Any],
    started: float,
) -> dict[str, Any]:
    """The answer to a run that ended: its final status, output and error, the
    capability result of a routed run (with its metadata and timing), and metadata
    (mode, steps, usage, ``duration_ms`` from the request to the final status)."""
    snapshot = await _snapshot(node, app, handle.channel)
    routing = snapshot.get("routing") if isinstance(snapshot, dict) else None
    result = routing.get("result") if isinstance(routing, dict) else None
    return {
        "status": status.get("status"),
        "stop_reason": status.get("stop_reason"),
        "output": status.get("last_response"),
        "error": status.get("error_message"),
        "result": result,
        "metadata": {
            "mode": mode,
            "steps": status.get("step_count"),
            "usage": status.get("usage"),
            "duration_ms": round((time.monotonic() - started) * 1000, 3),
        },
    }


def timed_out(handle: RunHandle, timeout: float, why: str | None = None) -> dict[str, Any]:
    """What a wait that ended without the run's end adds to the usual answer."""
    follow = f"/api/sessions/{handle.session_id}/events?until=final"
    if handle.position is not None:
        follow += f"&since={handle.position}"
    reason = why or f"the run did not end within {timeout:g} s (wait_seconds)"
    return {
        "waited": False,
        "note": f"{reason}; it goes on: follow it with GET {follow}, or fetch state_url "
        "once it has ended",
    }


async def _snapshot(node: Node, app: AppConfig, channel: str) -> Any:
    try:
        stored = await node.backend.load_value(app.id, state_key(channel))
    except BackendUnavailable:
        return None
    return None if stored is None else orjson.loads(stored)


async def wait_or_note(
    node: Node, app: AppConfig, handle: RunHandle, seconds: float
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(final status payload, None) or (None, the note of :func:`timed_out`)."""
    try:
        status = await final_status(node, app, handle, seconds)
    except (BackendUnavailable, FeedEnded) as exc:
        return None, timed_out(handle, seconds, f"the run cannot be followed here now ({exc})")
    return (status, None) if status is not None else (None, timed_out(handle, seconds))
