"""Runs: start an agent for a session and let its events flow to ``agent.<session>``.

:class:`RunManager` is what ``POST /run {input, session_id?}`` (seed 002's request
shape) calls. It answers at once with the session, execution and channel, runs the
agent in the background with an :class:`~agent_core.broadcasting.AgentEventAdapter`,
stores the final slim snapshot (standard preset with the continuation trace, so it
says why the run stopped, and a failed run's error message) for reconcile before the
final ``agent.status``, and refuses a second run on a busy session. A new run on a
session with a stored snapshot continues that conversation, and its step numbers
continue after the earlier runs' steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

import orjson
from pydantic import BaseModel, ConfigDict, Field

from agent_core.broadcasting import AdapterOptions, AgentEventAdapter
from agent_core.builder import DEFAULT_MAX_STEPS, AgentBuilder
from agent_core.demo_tools import demo_driver, demo_tools
from agent_core.drivers.base import ModelDriver, ModelRequest, StreamEvent
from agent_core.slim import SlimAgentStateSerializer, SlimSerializationConfig
from agent_core.state import AgentState
from broadcaster.envelope import channel_for
from broadcaster.publishers import Publisher, StateStore

__all__ = [
    "SESSION_ID_PATTERN",
    "DriverFactory",
    "PacedDriver",
    "RunHandle",
    "RunManager",
    "RunRequest",
    "RunStarter",
    "SessionBusy",
    "new_execution_id",
    "new_session_id",
    "scripted_demo_driver",
    "snapshot_config",
]

logger = logging.getLogger(__name__)

SESSION_ID_PATTERN = r"^[A-Za-z0-9_\-=@,.;]{1,100}$"
DriverFactory = Callable[[str], ModelDriver]
"""Makes the model driver for one run from its input text."""
SnapshotLoader = Callable[[str], Awaitable[bytes | None]]
PositionReader = Callable[[str], Awaitable[str | None]]
"""The current position (``epoch:offset``) of a channel."""


class RunRequest(BaseModel):
    """The body of ``POST /run``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input: str = Field(min_length=1, max_length=20_000)
    session_id: str | None = Field(default=None, pattern=SESSION_ID_PATTERN)
    trace: bool = Field(default=True, description="publish agent.continuation events")
    pace_ms: int = Field(
        default=0, ge=0, le=2_000, description="delay between streamed deltas (demo pacing)"
    )
    execution_id: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="the run's id on its envelopes (e.g. AG-UI's runId); default: x-<hex>",
    )
    max_steps: int | None = Field(
        default=None,
        ge=1,
        le=DEFAULT_MAX_STEPS,
        description=f"a lower step limit for this run (default {DEFAULT_MAX_STEPS})",
    )


@dataclass(frozen=True)
class RunHandle:
    """A started run. ``position`` is the channel's position before the run's first
    event: subscribing with it (resume) delivers the whole run, however late the
    client subscribes."""

    session_id: str
    execution_id: str
    channel: str
    position: str | None = None


class RunStarter(Protocol):
    """What ``POST /run`` needs: start a run and say where its final state will be."""

    async def start(self, request: RunRequest) -> RunHandle: ...

    def state_url(self, session_id: str) -> str: ...

    async def aclose(self, grace: float = 5.0) -> None: ...


class SessionBusy(Exception):
    """A run is already in progress on this session."""

    def __init__(self, session_id: str) -> None:
        super().__init__(
            f"session {session_id!r} already has a run in progress; wait for its final "
            "agent.status before starting another"
        )
        self.session_id = session_id


class PacedDriver:
    """Wraps a driver and waits ``pace`` seconds before each streamed event, so that a
    scripted run is watchable (and interruptible) like a real model."""

    def __init__(self, driver: ModelDriver, pace: float) -> None:
        self._driver = driver
        self._pace = pace

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamEvent]:
        async for event in self._driver.stream(request):
            await asyncio.sleep(self._pace)
            yield event


def new_session_id() -> str:
    return f"s-{secrets.token_hex(8)}"


def new_execution_id() -> str:
    return f"x-{secrets.token_hex(8)}"


def scripted_demo_driver(input_text: str) -> ModelDriver:
    """The deterministic scripted demo agent (weather + calculator)."""
    return demo_driver(input_text)


def snapshot_config() -> SlimSerializationConfig:
    """What runs store for reconcile: seed 004's standard preset with the continuation
    trace on (``last_continuation`` says why the run stopped and who decided)."""
    return replace(SlimSerializationConfig.standard(), include_continuation_trace=True)


def _claimed() -> asyncio.Future[AgentState | None]:
    """A placeholder for a run being started (resolved: nothing to wait for)."""
    future: asyncio.Future[AgentState | None] = asyncio.get_running_loop().create_future()
    future.set_result(None)
    return future


@dataclass
class _Run:
    handle: RunHandle
    task: asyncio.Future[AgentState | None]


@dataclass
class RunManager:
    """Starts and tracks runs.

    Args:
        publisher_for: the publisher a run's envelopes go through.
        state_store: where final snapshots go (read back by the reconcile endpoint).
        driver_factory: the model driver of a run (default: the scripted demo).
        state_url: the reconcile URL of a session, put into the final ``agent.status``.
        load_snapshot: reads the snapshot stored for a channel (to continue a
            conversation).
        channel_for_session: the channel of a session (``agent.<s>`` or a private one).
        position_of: reads a channel's current position (for :attr:`RunHandle.position`).
        max_runs: concurrent runs allowed (further ones are refused as busy).
    """

    publisher: Publisher
    state_store: StateStore
    driver_factory: DriverFactory = scripted_demo_driver
    state_url: Callable[[str], str] = lambda s: f"/api/sessions/{s}/state"
    load_snapshot: SnapshotLoader | None = None
    channel_for_session: Callable[[str], str] = channel_for
    position_of: PositionReader | None = None
    max_runs: int = 1000
    _runs: dict[str, _Run] = field(default_factory=dict)
    _serializer: SlimAgentStateSerializer = field(
        default_factory=lambda: SlimAgentStateSerializer(snapshot_config())
    )

    async def start(self, request: RunRequest) -> RunHandle:
        """Start a run in the background and return at once.

        Raises:
            SessionBusy: the session already has a run (or too many runs are going).
            broadcaster.backends.BackendUnavailable: the channel's position cannot be read.
        """
        session_id = request.session_id or new_session_id()
        if session_id in self._runs or len(self._runs) >= self.max_runs:
            raise SessionBusy(session_id)
        channel = self.channel_for_session(session_id)
        # Claim the session before awaiting, so two requests cannot both start it.
        self._runs[session_id] = _Run(RunHandle(session_id, "", channel), _claimed())
        try:
            position = None if self.position_of is None else await self.position_of(channel)
        except BaseException:
            del self._runs[session_id]
            raise
        execution_id = request.execution_id or new_execution_id()
        handle = RunHandle(session_id, execution_id, channel, position)
        task = asyncio.get_running_loop().create_task(self.execute(handle, request))
        self._runs[session_id] = _Run(handle, task)
        task.add_done_callback(lambda _: self._runs.pop(session_id, None))
        return handle

    def running(self, session_id: str) -> bool:
        return session_id in self._runs

    async def wait(self, session_id: str) -> AgentState | None:
        """The final state of the session's current run (None if none is running)."""
        run = self._runs.get(session_id)
        return None if run is None else await run.task

    async def aclose(self, grace: float = 5.0) -> None:
        """Let running runs finish for up to ``grace`` seconds, then cancel them."""
        tasks = [run.task for run in self._runs.values()]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def execute(self, handle: RunHandle, request: RunRequest) -> AgentState | None:
        """Run ``request`` as ``handle`` to its end (what :meth:`start` does in the
        background; a worker calls it for runs queued by another process). Returns the
        final state, or None if the run crashed (logged)."""
        options = AdapterOptions(include_continuation_trace=request.trace)
        adapter = AgentEventAdapter(
            self.publisher,
            handle.session_id,
            handle.execution_id,
            options=options,
            final_state=lambda state: self._store(handle, state),
            channel=handle.channel,
        )
        driver = self.driver_factory(request.input)
        if request.pace_ms:
            driver = PacedDriver(driver, request.pace_ms / 1000)
        builder = AgentBuilder().with_driver(driver).with_tools(*demo_tools())
        if request.max_steps is not None:
            builder = builder.with_max_steps(request.max_steps)
        agent = adapter.install(builder).build()
        try:
            start = await self._start_state(handle.channel, request.input)
            return await agent.run(start)
        except Exception as exc:
            logger.exception("run %s of session %s crashed", handle.execution_id, handle.session_id)
            # Whoever follows the run must not wait for a final status forever.
            await adapter.fail(f"the run crashed: {type(exc).__name__}: {exc}")
            return None
        finally:
            await adapter.aclose()

    async def _start_state(self, channel: str, text: str) -> AgentState | str:
        """Continue the session's stored conversation, or start a new one."""
        if self.load_snapshot is None:
            return text
        stored = await self.load_snapshot(channel)
        if stored is None:
            return text
        return self._serializer.deserialize(orjson.loads(stored)).with_user_message(text)

    async def _store(self, handle: RunHandle, state: AgentState) -> str:
        snapshot = self._serializer.serialize(state)
        await self.state_store.save(handle.channel, orjson.dumps(snapshot))
        return self.state_url(handle.session_id)
