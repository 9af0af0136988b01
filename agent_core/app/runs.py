"""Runs: start an agent for a session and let its events flow to ``agent.<session>``.

:class:`RunManager` is what ``POST /run {input, session_id?, mode?}`` (the routing design's
request shape) calls. It answers at once with the session, execution and channel, runs
the agent in the background with an :class:`~agent_core.adapters.broadcasting.AgentEventAdapter`,
stores the final slim snapshot (standard preset with the continuation trace, so it says
why the run stopped, and a failed run's error message) for reconcile before the final
``agent.status``, and refuses a second run on a busy session. A new run on a session
with a stored snapshot continues that conversation, and its step numbers continue after
the earlier runs' steps.

``mode`` ``"route"`` runs the capability router instead (docs/agent_core.md: resolve references,
classify, execute a capability, ask the continuation decider, remember the turn),
published by an :class:`~agent_core.adapters.orchestration_broadcasting.OrchestrationEventAdapter`;
its final snapshot is the slim process snapshot (with the last continuation) plus a
``routing`` object (input, resolved input, intent, capabilities, decisions, decider
errors, each step's capability result and the request's final one with their
metadata and timing, and the session's turns, which the next routed run of the
session resolves against).

The manager does not know the demo: its composition root passes the agent's driver
factory and tools, and the router factory (:mod:`agent_core.app.demo_routing`).

Admission, in order: the session must be free (:class:`SessionBusy`, 409; with
``claims`` the session is claimed in the backend, a lease renewed while the run goes,
so this holds across nodes), the node must have room (:class:`RunsFull`, 503), and the
client (its address) must be under its concurrency and rate limits
(:class:`TooManyRuns`, 429). Refusals carry ``retry_after`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, Literal, Protocol

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from agent_core._time import utc_now
from agent_core.adapters.broadcasting import (
    AdapterOptions,
    AgentEventAdapter,
    FinalStateRefused,
    encode_final_state,
)
from agent_core.adapters.orchestration_broadcasting import (
    OrchestrationEventAdapter,
    publishing_nested_runs,
)
from agent_core.builder import DEFAULT_MAX_STEPS, AgentBuilder
from agent_core.continuation import (
    ContinuationDecision,
    ContinuationEvaluation,
    ContinuationOutcome,
    StopReason,
)
from agent_core.drivers.base import ModelDriver, ModelRequest, StreamEvent
from agent_core.messages import Role
from agent_core.orchestrators.process_serialization import SlimProcessStateSerializer
from agent_core.orchestrators.routing.capabilities import CapabilityResult
from agent_core.orchestrators.routing.memory import SessionContext, SessionMemory, SessionTurn
from agent_core.orchestrators.routing.router import CapabilityRouter, RoutingState
from agent_core.slim import SlimAgentStateSerializer, SlimSerializationConfig
from agent_core.state import AgentState, AgentStatus
from agent_core.tools import Tool
from broadcaster.backends.base import Backend
from broadcaster.envelope import channel_for
from broadcaster.limits import ClientBuckets
from broadcaster.publishers import BufferedPublisher, Publisher, StateStore, run_recorder
from broadcaster.run_index import RunRecorder

__all__ = [
    "MAX_WAIT_SECONDS",
    "ROUTE_MEMORY_TURNS",
    "SESSION_ID_PATTERN",
    "WAIT_SECONDS",
    "BackendClaims",
    "ClientRateLimit",
    "DriverFactory",
    "ExecutionTaken",
    "PacedDriver",
    "RouterFactory",
    "RunHandle",
    "RunManager",
    "RunMode",
    "RunRefused",
    "RunRequest",
    "RunStarter",
    "RunsFull",
    "SessionBusy",
    "SessionClaims",
    "TooManyRuns",
    "ToolsFactory",
    "check_new_execution",
    "end_abandoned",
    "new_execution_id",
    "new_session_id",
    "resolve_mode",
    "run_claim",
    "snapshot_config",
]

logger = logging.getLogger(__name__)

SESSION_ID_PATTERN = r"^[A-Za-z0-9_\-=@,.;]{1,100}$"
DriverFactory = Callable[[str], ModelDriver]
"""Makes the model driver for one run from its input text."""
ToolsFactory = Callable[[], Sequence[Tool]]
"""Makes the tools of one agent run."""
RunMode = Literal["agent", "route"]
WAIT_SECONDS = 30.0
"""How long ``POST /run`` with ``wait`` waits for the run's end by default."""
MAX_WAIT_SECONDS = 300.0
"""The longest wait a request may ask for (a held connection must be bounded)."""
ROUTE_MEMORY_TURNS = 20
"""Turns of a session a routed run remembers (stored with its snapshot)."""
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
        description="the run's id on its envelopes (e.g. AG-UI's runId); default: x-<hex>; "
        "an id that is already a run of the session is refused (409)",
    )
    max_steps: int | None = Field(
        default=None,
        ge=1,
        le=DEFAULT_MAX_STEPS,
        description=f"a lower step limit for this run (default {DEFAULT_MAX_STEPS}; a "
        "routed run executes at most 5 capabilities)",
    )
    mode: RunMode | None = Field(
        default=None,
        description="agent: the tool-using agent; route: the capability router; "
        "default: the server's setting",
    )
    wait: bool = Field(
        default=False,
        description="answer when the run ends (200, the RunResponse: status, output, "
        "capability result, metadata with timing) instead of at once; after "
        "wait_seconds the usual 202 answer, with waited: false and a note",
    )
    wait_seconds: float = Field(
        default=WAIT_SECONDS,
        gt=0,
        le=MAX_WAIT_SECONDS,
        description=f"how long a wait may last (default {WAIT_SECONDS:g}, at most "
        f"{MAX_WAIT_SECONDS:g})",
    )

    @field_validator("input")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the input is blank: send the question or request to run")
        return value


RouterFactory = Callable[[RunRequest, SessionMemory], CapabilityRouter]
"""Makes the capability router of one routed run, with the session's memory."""


def resolve_mode(request: RunRequest, default: RunMode) -> RunRequest:
    """``request`` with its mode set (``default`` when it names none), so that a queued
    run carries the mode the web process chose."""
    return request if request.mode is not None else request.model_copy(update={"mode": default})


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
    """What ``POST /run`` needs: start a run and say where its final state will be.
    ``client`` (the caller's address) is what per-client limits count; None: no
    per-client limits."""

    async def start(self, request: RunRequest, client: str | None = None) -> RunHandle: ...

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


class ExecutionTaken(Exception):
    """A run start named an execution id (``POST /run``'s ``execution_id``, AG-UI's
    ``runId``) that is already a run of its session: a second run under it would
    rewrite the first's record (its index row, its trace). 409."""

    def __init__(self, session_id: str, execution_id: str) -> None:
        super().__init__(
            f"execution id {execution_id!r} is already a run of session {session_id!r}: a "
            "new run needs a new execution id (leave it out and the server assigns one)"
        )
        self.session_id = session_id
        self.execution_id = execution_id


async def check_new_execution(
    runs: RunRecorder | None, session_id: str, channel: str, execution_id: str | None
) -> None:
    """Refuse an execution id a client chose that names a run recorded on the session
    (in ``runs``, the run index): the client may name its new run, never take over one.
    Called once the session is claimed, so no other run of it can start meanwhile.

    Raises:
        ExecutionTaken: it does.
        broadcaster.backends.BackendUnavailable: the index cannot be read now.
    """
    if execution_id is None or runs is None:
        return
    if await runs.recorded(channel, execution_id):
        raise ExecutionTaken(session_id, execution_id)


class RunRefused(Exception):
    """No run was started, for a reason that passes: retry after ``retry_after``
    seconds (whole, at least 1; the ``Retry-After`` header). ``status`` is the HTTP
    status that says so."""

    status = 503

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = max(1, math.ceil(retry_after))

    @property
    def answer(self) -> dict[str, str | int]:
        """The JSON body of the refusal."""
        return {"error": str(self), "retry_after": self.retry_after}

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)}


class TooManyRuns(RunRefused):
    """This client started too many runs (at once, or too fast)."""

    status = 429


class RunsFull(RunRefused):
    """The node (or the run queue) is full."""

    status = 503


BUSY_RETRY_AFTER = 5.0
ENDING_GRACE = 5.0
"""Seconds a run start waits for the session's previous run to finish its last steps
once that run's final state is stored: whoever saw its final ``agent.status`` may start
the next run at once, and must not be told the session is busy."""
"""Seconds a client over its concurrency limit is told to wait (a run's end cannot be
predicted)."""


class ClientRateLimit(ClientBuckets):
    """Runs a client may start: ``burst`` at once, then ``per_minute`` (a token bucket
    per client, :class:`broadcaster.limits.ClientBuckets`).

    Raises:
        ValueError: for a non-positive rate or burst.
    """

    def __init__(
        self,
        per_minute: float,
        burst: int,
        max_clients: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(per_minute / 60, burst, max_clients, clock)
        self.per_minute = per_minute

    def take(self, client: str) -> float:
        """Spend one run of ``client``'s allowance; 0.0.

        Raises:
            TooManyRuns: none is left; ``retry_after`` says when one will be.
        """
        wait = super().take(client)
        if wait:
            raise TooManyRuns(
                f"too many runs from {client}: at most {self.burst} in a row, then "
                f"{self.per_minute:g} a minute; retry in {math.ceil(wait)} s",
                wait,
            )
        return wait


def run_claim(session_id: str) -> str:
    """The claim key of a session's run, in the backend (the same in every run mode)."""
    return f"run:{session_id}"


class SessionClaims(Protocol):
    """Claims on sessions shared by every node (leases: renewed while held)."""

    async def claim(self, session_id: str, owner: str, ttl: float) -> bool:
        """Claim or renew; False when another owner holds the session."""
        ...

    async def release(self, session_id: str, owner: str) -> None: ...


@dataclass(frozen=True)
class BackendClaims:
    """:class:`SessionClaims` in a node's backend (Redis: every node sees them)."""

    backend: Backend
    app_id: str

    async def claim(self, session_id: str, owner: str, ttl: float) -> bool:
        return await self.backend.claim_value(self.app_id, run_claim(session_id), owner, ttl)

    async def release(self, session_id: str, owner: str) -> None:
        await self.backend.release_value(self.app_id, run_claim(session_id), owner)


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


def snapshot_config() -> SlimSerializationConfig:
    """What runs store for reconcile: the slim snapshot's standard preset with the continuation
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
    client: str | None = None
    # Its final state is stored (or its run returned): its final agent.status is on its
    # way or out, and what is left (delivery, the run index, the claim) takes a few
    # round trips.
    ending: bool = False


@dataclass
class RunManager:
    """Starts and tracks runs.

    Args:
        publisher_for: the publisher a run's envelopes go through.
        state_store: where final snapshots go (read back by the reconcile endpoint).
        driver_factory: the model driver of an agent run.
        tools: the tools of an agent run.
        router_factory: the capability router of a routed run (None: ``mode: route``
            runs fail with a message saying so).
        default_mode: the mode of a request that names none.
        state_url: the reconcile URL of a session, put into the final ``agent.status``.
        load_snapshot: reads the snapshot stored for a channel (to continue a
            conversation).
        channel_for_session: the channel of a session (``agent.<s>`` or a private one).
        position_of: reads a channel's current position (for :attr:`RunHandle.position`).
        max_runs: concurrent runs allowed on this node (further ones: :class:`RunsFull`).
        claims: where sessions are claimed across nodes (None: in this process only).
        lease: seconds a claim lasts unless renewed (every third of it while running).
        client_runs: concurrent runs one client may have here (0: no limit).
        client_rate: how fast one client may start runs (None: no limit).
        max_duration: seconds a run may last (None: no limit); one that reaches it is
            stopped and ends with a ``failed`` status that says so.
        max_duration_name: how the limit is set (e.g. its setting), named in that status.
    """

    publisher: Publisher
    state_store: StateStore
    driver_factory: DriverFactory
    tools: ToolsFactory = tuple
    router_factory: RouterFactory | None = None
    default_mode: RunMode = "agent"
    state_url: Callable[[str], str] = lambda s: f"/api/sessions/{s}/state"
    load_snapshot: SnapshotLoader | None = None
    channel_for_session: Callable[[str], str] = channel_for
    position_of: PositionReader | None = None
    max_runs: int = 1000
    claims: SessionClaims | None = None
    lease: float = 15.0
    client_runs: int = 0
    client_rate: ClientRateLimit | None = None
    max_duration: float | None = None
    max_duration_name: str = "max_duration"
    _runs: dict[str, _Run] = field(default_factory=dict)
    _client_counts: dict[str, int] = field(default_factory=dict)
    _capabilities: dict[str, str] = field(default_factory=dict)
    _serializer: SlimAgentStateSerializer = field(
        default_factory=lambda: SlimAgentStateSerializer(snapshot_config())
    )

    async def start(self, request: RunRequest, client: str | None = None) -> RunHandle:
        """Start a run in the background and return at once.

        Raises:
            SessionBusy: the session already has a run (on any node, with ``claims``).
            ExecutionTaken: the request's ``execution_id`` is a recorded run of the
                session.
            RunsFull: this node runs ``max_runs`` runs already.
            TooManyRuns: ``client`` has ``client_runs`` runs going, or started runs too
                fast.
            broadcaster.backends.BackendUnavailable: the claim or the channel's position
                cannot be made or read.
        """
        session_id = request.session_id or new_session_id()
        previous = self._runs.get(session_id)
        if previous is not None and previous.ending:
            # Its final agent.status may have reached the caller already (it is published
            # right after the state is stored); what is left of it takes milliseconds.
            await asyncio.wait({previous.task}, timeout=ENDING_GRACE)
        self._admit(session_id, client)
        channel = self.channel_for_session(session_id)
        # Claim the session before awaiting, so two requests cannot both start it.
        self._runs[session_id] = _Run(RunHandle(session_id, "", channel), _claimed(), client)
        self._count(client, 1)
        owner = secrets.token_hex(8)
        try:
            position = await self._claim_and_locate(session_id, owner, channel, request)
        except BaseException:
            self._forget(session_id)
            if client is not None and self.client_rate is not None:
                self.client_rate.refund(client)
            raise
        execution_id = request.execution_id or new_execution_id()
        handle = RunHandle(session_id, execution_id, channel, position)
        task = asyncio.get_running_loop().create_task(self._claimed_run(handle, request, owner))
        self._runs[session_id] = _Run(handle, task, client)
        task.add_done_callback(lambda _: self._forget(session_id))
        return handle

    def _admit(self, session_id: str, client: str | None) -> None:
        """Refuse at once what cannot start (nothing awaited: no race with itself)."""
        if session_id in self._runs:
            raise SessionBusy(session_id)
        if len(self._runs) >= self.max_runs:
            raise RunsFull(
                f"this node runs {self.max_runs} runs already, its limit; retry later",
                BUSY_RETRY_AFTER,
            )
        if client is None:
            return
        if self.client_runs and self._client_counts.get(client, 0) >= self.client_runs:
            raise TooManyRuns(
                f"too many runs from {client}: {self.client_runs} are going already; "
                "wait for one to end",
                BUSY_RETRY_AFTER,
            )
        if self.client_rate is not None:
            self.client_rate.take(client)

    def _count(self, client: str | None, delta: int) -> None:
        if client is None:
            return
        count = self._client_counts.get(client, 0) + delta
        if count > 0:
            self._client_counts[client] = count
        else:
            self._client_counts.pop(client, None)

    def _forget(self, session_id: str) -> None:
        run = self._runs.pop(session_id, None)
        if run is not None:
            self._count(run.client, -1)

    async def _claim_and_locate(
        self, session_id: str, owner: str, channel: str, request: RunRequest
    ) -> str | None:
        """Claim the session across nodes, check the execution id the request chose,
        then read the channel's position."""
        if self.claims is not None and not await self.claims.claim(session_id, owner, self.lease):
            raise SessionBusy(session_id)
        try:
            runs = run_recorder(self.state_store)
            await check_new_execution(runs, session_id, channel, request.execution_id)
            return None if self.position_of is None else await self.position_of(channel)
        except BaseException:
            await self._release(session_id, owner)
            raise

    async def _claimed_run(
        self, handle: RunHandle, request: RunRequest, owner: str
    ) -> AgentState | None:
        """The run, with its claim renewed while it goes and released at its end."""
        if self.claims is None:
            return await self.execute(handle, request)
        renewer = asyncio.get_running_loop().create_task(self._renew(handle.session_id, owner))
        try:
            return await self.execute(handle, request)
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            await self._release(handle.session_id, owner)

    async def _renew(self, session_id: str, owner: str) -> None:
        assert self.claims is not None
        while True:
            await asyncio.sleep(self.lease / 3)
            try:
                if not await self.claims.claim(session_id, owner, self.lease):
                    logger.warning("the run of session %s lost its claim", session_id)
            except Exception as exc:  # the next renewal may work; the lease is 3x longer
                logger.warning("cannot renew the claim on session %s: %s", session_id, exc)

    async def _release(self, session_id: str, owner: str) -> None:
        if self.claims is None:
            return
        try:
            await self.claims.release(session_id, owner)
        except Exception as exc:  # it expires after the lease anyway
            logger.warning("cannot release the claim on session %s: %s", session_id, exc)

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
        final state (of a routed run: see :meth:`route`), or None if the run crashed
        (logged) or reached ``max_duration``. The run is recorded in the run index of
        the state store (:mod:`broadcaster.run_index`) as it starts and once its final
        status is published."""
        runs = run_recorder(self.state_store)
        if runs is None:
            try:
                return await self._execute(handle, request)
            finally:
                self._ending(handle)
        await runs.started(handle.channel, handle.execution_id, input_text=request.input)
        try:
            return await self._execute(handle, request)
        finally:
            self._ending(handle)
            await _delivered(self.publisher)
            capability = self._capabilities.pop(handle.execution_id, None)
            await runs.ended(handle.channel, handle.execution_id, capability=capability)

    async def _execute(self, handle: RunHandle, request: RunRequest) -> AgentState | None:
        if resolve_mode(request, self.default_mode).mode == "route":
            return await self.route(handle, request)
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
        builder = AgentBuilder().with_driver(driver).with_tools(*self.tools())
        if request.max_steps is not None:
            builder = builder.with_max_steps(request.max_steps)
        agent = adapter.install(builder).build()
        deadline = asyncio.timeout(self.max_duration)
        try:
            start = await self._start_state(handle.channel, request.input)
            async with deadline:
                return await agent.run(start)
        except Exception as exc:
            # Whoever follows the run must not wait for a final status forever, and
            # whoever reconciles must find this run's state, not the one before.
            message = self._failure(handle, exc, deadline)
            await adapter.fail(message, await self._store_stopped(handle, adapter, message))
            return None
        finally:
            await adapter.aclose()

    async def _store_stopped(
        self, handle: RunHandle, adapter: AgentEventAdapter, reason: str
    ) -> str | None:
        """Store the state of a run that did not reach its end (as of its last completed
        step) as ``failed`` because of ``reason``; where it is, or None if it was not
        stored (logged)."""
        if adapter.finished or adapter.latest is None:
            return None  # ended already (its state stored then), or never started
        state = stopped_state(adapter.latest, reason, utc_now())
        try:
            return await self._store(handle, state)
        except FinalStateRefused as exc:
            return exc.state_url
        except Exception:
            logger.exception("cannot store the failed state of session %s", handle.session_id)
            return None

    def _failure(self, handle: RunHandle, exc: Exception, deadline: asyncio.Timeout) -> str:
        """The message of the failed status of a run that ended with ``exc``: stopped at
        its maximum duration, or crashed (logged with its traceback)."""
        run = (handle.execution_id, handle.session_id)
        if deadline.expired():
            logger.warning("run %s of session %s reached its maximum duration", *run)
            return (
                f"the run was stopped after {self.max_duration:g} s, its maximum duration "
                f"({self.max_duration_name})"
            )
        logger.exception("run %s of session %s crashed", *run)
        return f"the run crashed: {type(exc).__name__}: {exc}"

    async def _start_state(self, channel: str, text: str) -> AgentState | str:
        """Continue the session's stored conversation, or start a new one."""
        if self.load_snapshot is None:
            return text
        stored = await self.load_snapshot(channel)
        if stored is None:
            return text
        data = orjson.loads(stored)
        if "process" in data:  # a routed run's snapshot: continue its conversation
            data = {**data, "agent_id": data["id"]}
        return self._serializer.deserialize(data).with_user_message(text)

    async def _store(self, handle: RunHandle, state: AgentState) -> str:
        """Store ``state`` as the session's final one; where it is.

        Raises:
            FinalStateRefused: JSON cannot carry it; it was stored ``failed`` instead
                (:func:`~agent_core.adapters.broadcasting.encode_final_state`).
        """
        data, refused = encode_final_state(self._serializer.serialize(state))
        await self.state_store.save(handle.channel, data)
        self._ending(handle)
        if refused is not None:
            raise FinalStateRefused(refused, self.state_url(handle.session_id))
        return self.state_url(handle.session_id)

    def _ending(self, handle: RunHandle) -> None:
        """The run of ``handle`` stored its final state, or returned: a start on its
        session now waits for its end instead of being refused (:data:`ENDING_GRACE`)."""
        run = self._runs.get(handle.session_id)
        if run is not None and run.handle.execution_id == handle.execution_id:
            run.ending = True

    # -- routed runs --------------------------------------------------------------------

    async def route(self, handle: RunHandle, request: RunRequest) -> AgentState | None:
        """Run ``request`` through the capability router as ``handle``: the final state
        is stored before the final ``agent.status``, which names its URL. Returns None
        (the routed state is not an agent state; it is stored, as a snapshot); a crash
        is logged and ends with a failed status."""
        options = AdapterOptions(include_continuation_trace=request.trace)
        adapter = OrchestrationEventAdapter(
            self.publisher,
            handle.session_id,
            handle.execution_id,
            options=options,
            channel=handle.channel,
            defer_final=True,
        )
        deadline = asyncio.timeout(self.max_duration)
        try:
            if self.router_factory is None:
                raise RuntimeError("this server has no capability router; use mode 'agent'")
            memory = _RunMemory(await self._session_context(handle))
            router = self.router_factory(request, memory)
            adapter.install(router)
            async with deadline:
                with publishing_nested_runs(adapter):
                    state = await router.handle(
                        request.input, handle.session_id, execution_id=handle.execution_id
                    )
            await adapter.publish_final(*await self._store_routed(handle, state, memory.context))
        except Exception as exc:
            message = self._failure(handle, exc, deadline)
            if not await adapter.publish_final(None):
                await adapter.fail(message)
        finally:
            await adapter.aclose()
        return None

    async def _session_context(self, handle: RunHandle) -> SessionContext:
        """The session's turns from its stored snapshot (routed or agent run)."""
        empty = SessionContext(handle.session_id)
        stored = None if self.load_snapshot is None else await self.load_snapshot(handle.channel)
        if stored is None:
            return empty
        try:
            return _context_of(handle.session_id, orjson.loads(stored))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            logger.warning("session %s: unreadable stored turns (%s)", handle.session_id, exc)
            return empty

    async def _store_routed(
        self, handle: RunHandle, state: RoutingState, context: SessionContext
    ) -> tuple[str | None, str | None]:
        """Store a routed run's final state: where it is (None: it was not stored,
        logged), and why the run failed when it had to be stored ``failed``."""
        capabilities = [r.step.capability for r in state.execution_results()]
        if capabilities:
            self._capabilities[handle.execution_id] = ", ".join(dict.fromkeys(capabilities))
        try:
            data, refused = encode_final_state(_routed_snapshot(state, context))
            await self.state_store.save(handle.channel, data)
            self._ending(handle)
        except Exception:
            logger.exception("could not store the final state of session %s", handle.session_id)
            return None, None
        return self.state_url(handle.session_id), refused


_ROUTED = SlimProcessStateSerializer(
    RoutingState, replace(SlimSerializationConfig.standard(), include_continuation_trace=True)
)


@dataclass
class _RunMemory:
    """A session's memory for one routed run: its stored turns, plus the new one."""

    context: SessionContext

    async def load(self, session_id: str) -> SessionContext:
        return self.context

    async def append(self, session_id: str, turn: SessionTurn) -> SessionContext:
        self.context = self.context.with_turn(turn, ROUTE_MEMORY_TURNS)
        return self.context


def _clip(text: str, limit: int = 2000) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _routed_snapshot(state: RoutingState, context: SessionContext) -> dict[str, Any]:
    """The slim process snapshot plus what the routing decided and remembers."""
    snapshot = _ROUTED.serialize(state)
    turns = [
        {**t.to_dict(), "input": _clip(t.input), "output": _clip(t.output)} for t in context.turns
    ]
    steps = state.execution_results()
    snapshot["routing"] = {
        "input": state.input,
        "resolved_input": state.resolved_input,
        "intent": None if state.intent is None else state.intent.model_dump(mode="json"),
        "capabilities": [r.step.capability for r in steps],
        "decisions": [
            None if r.step.decision is None else r.step.decision.model_dump(mode="json")
            for r in steps
        ],
        "decider_errors": [r.step.decider_error for r in steps],
        "results": [_result(r.step.result) for r in steps],
        "result": _result(state.result()),
        "context": {"session_id": context.session_id, "turns": turns},
    }
    return snapshot


def _result(result: CapabilityResult | None) -> dict[str, Any] | None:
    """A capability result for the snapshot (output and metadata values clipped to
    2,000 characters; usage is the steps')."""
    if result is None:
        return None
    data = result.model_dump(mode="json", exclude={"usage"})
    metadata = {k: _bounded(v) for k, v in data["metadata"].items()}
    return {**data, "output": _clip(result.output), "metadata": metadata}


def _bounded(value: Any, limit: int = 2000) -> Any:
    """A metadata value as stored: a string clipped, anything longer than ``limit``
    characters of JSON as its clipped JSON text (a capability's metadata is its own)."""
    if isinstance(value, str):
        return _clip(value, limit)
    text = orjson.dumps(value).decode()
    return value if len(text) <= limit else _clip(text, limit)


def _context_of(session_id: str, snapshot: dict[str, Any]) -> SessionContext:
    """A routed snapshot's remembered turns, or an agent snapshot's conversation as
    turns (each user message and the assistant's last answer to it)."""
    routing = snapshot.get("routing")
    if isinstance(routing, dict) and routing.get("context"):
        return SessionContext.from_dict({**routing["context"], "session_id": session_id})
    turns: list[SessionTurn] = []
    for message in snapshot.get("messages") or ():
        role, content = message.get("role"), str(message.get("content") or "")
        if role == Role.USER.value:
            turns.append(SessionTurn(input=content, output=""))
        elif role == Role.ASSISTANT.value and turns and content:
            turns[-1] = replace(turns[-1], output=content)
    return SessionContext(session_id, tuple(turns[-ROUTE_MEMORY_TURNS:]))


ABANDONED_BY = "RunSupervisor"
"""The criterion name on the stop of a run that did not reach its end: its executor
was lost, it crashed, or it reached its maximum duration."""


def stopped_state(state: AgentState, reason: str, now: datetime) -> AgentState:
    """``state``, of a run in progress, ended ``failed`` because of ``reason``: the stop
    is recorded as the supervisor's (``last_continuation``, resolved by
    :data:`ABANDONED_BY`) and ``reason`` is in its metadata, so a snapshot explains it
    like any other failure."""
    stop = ContinuationEvaluation(
        ABANDONED_BY, ContinuationDecision.FORBID, reason, stop_reason=StopReason.ERROR
    )
    return (
        state.with_start_outcome(ContinuationOutcome.from_evaluations([stop]))
        .end_execution(now, AgentStatus.FAILED, StopReason.ERROR)
        .with_metadata("error", reason)
    )


async def end_abandoned(
    publisher: Publisher,
    state_store: StateStore,
    handle: RunHandle,
    request: RunRequest,
    reason: str,
    *,
    load_snapshot: SnapshotLoader | None = None,
    state_url: str | None = None,
) -> None:
    """End a run whose executor is gone (its worker died, or no worker took it): store
    a ``failed`` final state (the stored conversation plus the run's input, ``reason``
    in its metadata) and publish the final ``failed`` ``agent.status`` (stop reason
    ``error``, ``reason`` as its message), so that whoever follows the run stops
    waiting and can reconcile. What the lost executor did is not in the state."""
    serializer = SlimAgentStateSerializer(snapshot_config())
    try:
        stored = None if load_snapshot is None else await load_snapshot(handle.channel)
        state = AgentState() if stored is None else serializer.deserialize(orjson.loads(stored))
        now = utc_now()
        started = state.with_user_message(request.input).start_execution(now, handle.execution_id)
        state = stopped_state(started, reason, now)
        await state_store.save(handle.channel, orjson.dumps(serializer.serialize(state)))
    except Exception:
        logger.exception("cannot store the failed state of session %s", handle.session_id)
        state_url = None
    adapter = AgentEventAdapter(
        publisher, handle.session_id, handle.execution_id, channel=handle.channel
    )
    await adapter.fail(reason, state_url=state_url)
    runs = run_recorder(state_store)
    if runs is not None:
        await _delivered(publisher)
        await runs.ended(handle.channel, handle.execution_id, status="failed", error=reason)


async def _delivered(publisher: Publisher, within: float = 5.0) -> None:
    """Wait (a bounded time) until a buffered publisher has delivered what it holds, so
    that the run's envelopes are in the channel's history when its trace is copied."""
    if isinstance(publisher, BufferedPublisher):
        await publisher.flush(within)
