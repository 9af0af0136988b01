"""AG-UI: run the agent for an AG-UI client and stream the run as AG-UI events (SSE).

``POST /ag-ui`` (``AGENT_DEMO_AGUI_PATH``) takes AG-UI's ``RunAgentInput`` and answers
``text/event-stream`` with the run as AG-UI events, built with the ``ag-ui-protocol``
package's models and encoder. The run is started like ``POST /run`` (the run manager,
or the queue of workers), so it publishes its envelopes on ``agent.<threadId>`` as
usual; this endpoint follows that channel from the run's position (the SSE machinery's
:class:`~broadcaster.sse.ChannelFeed`) and translates the envelopes
(:class:`AguiMapper`): one source of truth, and the same run is visible over WebSocket
at the same time.

Input: ``threadId`` is the session id (a later run on the same thread continues the
conversation, whose history the server keeps); ``runId`` is the execution id (the
envelopes' ``execution_id``); the text of the last ``user`` message is the run's input
(earlier messages are the client's copy of that history); ``forwardedProps`` may carry
``trace``, ``pace_ms``, ``mode`` (``agent`` or ``route``) and ``max_steps`` as
``POST /run`` does. ``tools``, ``context`` and ``state`` are
validated and accepted; the server-side agent runs with its own tools and state.

=====================================  ===============================================
envelope                               AG-UI events
=====================================  ===============================================
``agent.status`` in_progress           ``RUN_STARTED`` (metadata.broadcaster: session,
                                       execution id, channel, position)
``agent.step.started``                 ``STEP_STARTED`` (``stepName`` ``step-<n>``)
``agent.stream.chunk``                 ``TEXT_MESSAGE_START`` (first chunk of a message),
                                       ``TEXT_MESSAGE_CONTENT``, ``TEXT_MESSAGE_END``
                                       (``is_complete``, or before a tool call / step end)
``agent.tool.started``                 ``TOOL_CALL_START`` (the real ``tool_call_id``),
                                       ``TOOL_CALL_ARGS`` (the arguments as JSON;
                                       none when the publisher redacts them),
                                       ``TOOL_CALL_END``
``agent.tool.completed``               ``TOOL_CALL_RESULT`` (result summary, or the
                                       error; metadata: success, duration_ms)
a routed run's phase (tool name in     ``CUSTOM`` named ``agent.routing`` (value: the
``ROUTING_PHASES``: classifier,        tool envelope's payload and ``state``
decider, memory) started / completed   ``running`` / ``done``): not a tool call
``agent.continuation``                 ``CUSTOM`` named ``agent.continuation``
``agent.step.completed``               ``STEP_FINISHED``
``agent.status`` completed             a text message of ``last_response`` when the
                                       run streamed no text of its own (a routed run:
                                       its answer comes from a capability),
                                       ``STATE_SNAPSHOT`` (the stored slim state),
                                       ``RUN_FINISHED`` (result: the status payload;
                                       usage: the run's own tokens, its steps' sum)
``agent.status`` failed                ``STATE_SNAPSHOT`` if stored, ``RUN_ERROR``
=====================================  ===============================================

A run nested in this one (a routed capability's inner agent, its own execution id) is
left out: its work is the capability's tool call, and its answer is the run's.

Errors before the stream starts are JSON ``{"error": ...}``: 413 (a body over the
server's ``max_request_bytes``), 408 (a body slower than ``body_timeout``), 422 (not a
valid ``RunAgentInput``, or no user message, or a ``threadId`` that cannot be a session
id; ``details`` lists at most 10 errors, without the input),
403 (private sessions: the thread exists and the request lacks its session token as
``Authorization: Bearer``), 409 (the thread has a run in progress), 503 (the backend is
unreachable). With private sessions the session token is returned in the
``X-Session-Token`` header and ``RUN_STARTED``'s metadata. A stream holds its TCP
connection, which counts against the server's per-address limit
(``max_connections_per_ip``: ``429`` with ``Retry-After`` above it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Protocol, assert_never

import orjson
from ag_ui.core import (
    BaseEvent,
    CustomEvent,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedEvent,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    StateSnapshotEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TextPart,
    TokenUsage,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from ag_ui.encoder import EventEncoder
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agent_core.app._gate import GATED_METHODS, run_gate
from agent_core.app._streams import FeedResponse, RunHost, json_error, last_run, start_run
from agent_core.app.runs import RunHandle, RunRequest
from broadcaster import envelope as env
from broadcaster.backends.base import BackendUnavailable
from broadcaster.http_input import BodyRefused, describe_validation, read_body, validation_details
from broadcaster.publication import Position
from broadcaster.publishers import state_key
from broadcaster.sessions import SessionRefused, session_channel
from broadcaster.sse import HEARTBEAT, ChannelFeed, FeedItem

__all__ = [
    "AGUI_PATH",
    "CONTINUATION_EVENT",
    "ROUTING_EVENT",
    "AguiMapper",
    "InvalidInput",
    "routes",
    "run_request",
]

logger = logging.getLogger(__name__)

AGUI_PATH = "/ag-ui"
CONTINUATION_EVENT = "agent.continuation"
"""The name of the ``CUSTOM`` event carrying a step's continuation decision."""
ROUTING_EVENT = "agent.routing"
"""The name of the ``CUSTOM`` event carrying a routed run's phase (not a tool call)."""
_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_FINAL = ("completed", "failed")


class InvalidInput(ValueError):
    """A valid ``RunAgentInput`` that this server cannot run (said in the message)."""


# -- input ----------------------------------------------------------------------------


_FORWARDED = ("trace", "pace_ms", "mode", "max_steps")
"""The ``forwardedProps`` that pass through to the run (as ``POST /run`` names them)."""


def run_request(agent_input: RunAgentInput) -> RunRequest:
    """The run an AG-UI input asks for: the last user message's text on session
    ``threadId`` as execution ``runId``, with ``trace``, ``pace_ms``, ``mode`` and
    ``max_steps`` from ``forwardedProps``.

    Raises:
        InvalidInput: no user message with text, or a field our runs do not accept
            (named with its AG-UI name: ``threadId``, ``runId``,
            ``forwardedProps.pace_ms``).
    """
    props = agent_input.forwarded_props if isinstance(agent_input.forwarded_props, dict) else {}
    fields: dict[str, Any] = {"input": _last_user_text(agent_input)}
    fields["session_id"] = agent_input.thread_id
    fields["execution_id"] = agent_input.run_id
    fields.update({k: props[k] for k in _FORWARDED if k in props})
    try:
        return RunRequest.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = str(first["loc"][0]) if first["loc"] else "body"
        name = {"session_id": "threadId", "execution_id": "runId", "input": "messages"}.get(where)
        raise InvalidInput(f"{name or 'forwardedProps.' + where}: {first['msg']}") from None


def _last_user_text(agent_input: RunAgentInput) -> str:
    for message in reversed(agent_input.messages):
        if message.role != "user":
            continue
        content = message.content
        if isinstance(content, str):
            text = content
        else:
            text = "\n".join(part.text for part in content if isinstance(part, TextPart))
        if text.strip():
            return text
    raise InvalidInput(
        "messages: no user message with text; the last user message is the run's input"
    )


# -- envelopes to AG-UI events (sans I/O) ---------------------------------------------


class AguiMapper:
    """Translates one run's envelopes, in channel order, into AG-UI events that pass
    the AG-UI client's sequence checks (every message, tool call and step opened is
    closed before ``RUN_FINISHED``).

    Args:
        thread_id: AG-UI ``threadId`` (the session).
        run_id: AG-UI ``runId``.
        metadata: put on ``RUN_STARTED`` (e.g. where to follow the run over WebSocket).
    """

    def __init__(self, thread_id: str, run_id: str, metadata: dict[str, Any] | None = None):
        self.thread_id = thread_id
        self.run_id = run_id
        self.metadata = metadata
        self.started = False
        self.done = False
        self._messages = 0
        self._text: str | None = None
        self._text_step: int | None = None
        self._step_text: dict[int, str] = {}
        self._steps: list[str] = []
        self._usage: list[env.UsagePayload] = []

    def feed(self, envelope: env.Envelope, snapshot: Any = None) -> list[BaseEvent]:
        """The AG-UI events for ``envelope``; ``snapshot`` is the stored slim state,
        sent with the final status."""
        if self.done:
            return []
        at = _millis(envelope.timestamp)
        events = [] if self.started else [self._run_started(at)]
        match envelope:
            case env.AgentStatus():
                events += self._status(envelope.payload, snapshot, at)
            case env.StepStarted():
                events += self._step_started(envelope.payload, at)
            case env.StepCompleted():
                self._usage.append(envelope.payload.usage)
                events += self._step_finished(envelope.payload.step_number, at)
            case env.StreamChunk():
                events += self._chunk(envelope.payload, at)
            case env.ToolStarted() if envelope.payload.tool_name in env.ROUTING_PHASES:
                events += [self._phase(envelope.payload, "running", at)]
            case env.ToolCompleted() if envelope.payload.tool_name in env.ROUTING_PHASES:
                events += [self._phase(envelope.payload, "done", at)]
            case env.ToolStarted():
                events += self._tool_started(envelope.payload, at)
            case env.ToolCompleted():
                events += [self._tool_result(envelope.payload, at)]
            case env.AgentContinuation():
                value = envelope.payload.model_dump(mode="json")
                events += [CustomEvent(name=CONTINUATION_EVENT, value=value, timestamp=at)]
            case _:
                assert_never(envelope)
        return events

    def error(self, message: str, code: str | None = None) -> list[BaseEvent]:
        """End the run with ``RUN_ERROR`` (e.g. its events can no longer be read)."""
        if self.done:
            return []
        self.done = True
        opening = [] if self.started else [self._run_started(None)]
        self.started = True
        return [*opening, RunErrorEvent(message=message, code=code)]

    def _run_started(self, at: int | None) -> BaseEvent:
        self.started = True
        return RunStartedEvent(
            thread_id=self.thread_id, run_id=self.run_id, timestamp=at, metadata=self.metadata
        )

    def _status(self, payload: env.StatusPayload, snapshot: Any, at: int) -> list[BaseEvent]:
        if payload.status not in _FINAL:
            return []
        self.done = True
        state = [] if snapshot is None else [StateSnapshotEvent(snapshot=snapshot, timestamp=at)]
        if payload.status == "failed":
            message = payload.error_message or "the run failed"
            return [*state, RunErrorEvent(message=message, code=payload.stop_reason, timestamp=at)]
        closing = self._close_text(at)
        if not self._messages and payload.last_response:
            closing += self._answer(payload.last_response, at)
        closing += [
            StepFinishedEvent(step_name=name, timestamp=at) for name in reversed(self._steps)
        ]
        self._steps.clear()
        usage = env.run_usage(self._usage, payload.usage)
        finished = RunFinishedEvent(
            thread_id=self.thread_id,
            run_id=self.run_id,
            result=payload.model_dump(mode="json", exclude_none=True),
            outcome=RunFinishedSuccessOutcome(),
            usage=None if usage is None else [_usage(usage)],
            timestamp=at,
        )
        return [*closing, *state, finished]

    def _answer(self, text: str, at: int) -> list[BaseEvent]:
        """The run's answer as one text message: a run that streamed no text of its own
        (a routed run answers through its capability) still shows a reply."""
        opened = self._open_text(None, at)
        content = TextMessageContentEvent(message_id=self._text or "", delta=text, timestamp=at)
        return [opened, content, *self._close_text(at)]

    def _phase(
        self, payload: env.ToolStartedPayload | env.ToolCompletedPayload, state: str, at: int
    ) -> BaseEvent:
        """A routed run's phase (classifier, decider, memory): shown as such, not as a
        tool call of the agent."""
        value = {"state": state, **payload.model_dump(mode="json", exclude_none=True)}
        return CustomEvent(name=ROUTING_EVENT, value=value, timestamp=at)

    def _step_started(self, payload: env.StepStartedPayload, at: int) -> list[BaseEvent]:
        name = f"step-{payload.step_number}"
        if name in self._steps:
            return []
        self._steps.append(name)
        metadata = None if payload.actor is None else {"actor": payload.actor}
        return [StepStartedEvent(step_name=name, timestamp=at, metadata=metadata)]

    def _step_finished(self, step_number: int, at: int) -> list[BaseEvent]:
        name = f"step-{step_number}"
        events = self._close_text(at)
        if name in self._steps:
            self._steps.remove(name)
            events.append(StepFinishedEvent(step_name=name, timestamp=at))
        return events

    def _chunk(self, payload: env.StreamChunkPayload, at: int) -> list[BaseEvent]:
        events = [] if payload.step_number == self._text_step else self._close_text(at)
        if self._text is None and (payload.chunk or not payload.is_complete):
            events.append(self._open_text(payload.step_number, at))
        if self._text is not None and payload.chunk:
            events.append(
                TextMessageContentEvent(message_id=self._text, delta=payload.chunk, timestamp=at)
            )
        if payload.is_complete:
            events += self._close_text(at)
        return events

    def _open_text(self, step: int | None, at: int) -> BaseEvent:
        self._messages += 1
        self._text = f"{self.run_id}:text-{self._messages}"
        self._text_step = step
        if step is not None:
            self._step_text[step] = self._text
        return TextMessageStartEvent(message_id=self._text, role="assistant", timestamp=at)

    def _close_text(self, at: int) -> list[BaseEvent]:
        if self._text is None:
            return []
        message_id, self._text, self._text_step = self._text, None, None
        return [TextMessageEndEvent(message_id=message_id, timestamp=at)]

    def _tool_started(self, payload: env.ToolStartedPayload, at: int) -> list[BaseEvent]:
        call = payload.tool_call_id
        parent = None if payload.step_number is None else self._step_text.get(payload.step_number)
        events = self._close_text(at)
        events.append(
            ToolCallStartEvent(
                tool_call_id=call,
                tool_call_name=payload.tool_name,
                parent_message_id=parent,
                timestamp=at,
            )
        )
        if payload.arguments is not None:  # None: the publisher redacts arguments
            arguments = orjson.dumps(payload.arguments, default=str).decode()
            events.append(ToolCallArgsEvent(tool_call_id=call, delta=arguments, timestamp=at))
        events.append(ToolCallEndEvent(tool_call_id=call, timestamp=at))
        return events

    def _tool_result(self, payload: env.ToolCompletedPayload, at: int) -> BaseEvent:
        if payload.success:
            content = payload.result_summary or ""
        else:
            content = f"error: {payload.error or 'the tool failed'}"
        metadata: dict[str, Any] = {"success": payload.success, "duration_ms": payload.duration_ms}
        if payload.error is not None:
            metadata["error"] = payload.error
        return ToolCallResultEvent(
            message_id=f"{self.run_id}:result-{payload.tool_call_id}",
            tool_call_id=payload.tool_call_id,
            content=content,
            role="tool",
            timestamp=at,
            metadata=metadata,
        )


def _usage(usage: env.UsagePayload) -> TokenUsage:
    return TokenUsage(
        input_tokens=usage.prompt, output_tokens=usage.completion, total_tokens=usage.total
    )


def _millis(timestamp: str) -> int:
    moment = datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


# -- the endpoint ---------------------------------------------------------------------


class _Settings(Protocol):
    @property
    def private_sessions(self) -> bool: ...

    @property
    def agui_path(self) -> str: ...


class Host(RunHost, Protocol):
    """What the endpoint needs from the extension that serves it (the demo)."""

    @property
    def settings(self) -> _Settings: ...


SnapshotLoader = Callable[[], Awaitable[Any]]


def routes(host: Host) -> list[Route]:
    """The AG-UI route of ``host`` (at ``host.settings.agui_path``)."""

    async def run(request: Request) -> Response:
        return await _run(host, request)

    gated = run_gate(host, run)
    return [Route(host.settings.agui_path, gated, methods=GATED_METHODS, name="ag-ui")]


async def _run(host: Host, request: Request) -> Response:
    settings = host.node.settings
    try:
        body = await read_body(request, settings.max_request_bytes, settings.body_timeout)
        agent_input = RunAgentInput.model_validate(orjson.loads(body))
        wanted = run_request(agent_input)
    except BodyRefused as exc:
        return json_error(exc.status, exc.message)
    except orjson.JSONDecodeError as exc:
        return json_error(422, f"the body must be a JSON RunAgentInput: {exc}")
    except ValidationError as exc:
        message = describe_validation(exc, "RunAgentInput")
        return json_error(422, message, details=validation_details(exc))
    except InvalidInput as exc:
        return json_error(422, f"invalid RunAgentInput: {exc}")
    retried = await _retried(host, request, agent_input.thread_id, agent_input.run_id)
    if retried is not None:
        return retried
    started = await start_run(host, request, agent_input.thread_id, wanted, "thread")
    if isinstance(started, Response):
        return started
    return _stream(host, agent_input.run_id, started.handle, started.token)


async def _retried(host: Host, request: Request, thread_id: str, run_id: str) -> Response | None:
    """The answer to a POST whose ``runId`` is its thread's last run (a client retrying
    after its stream dropped), or None for a new run. While that run goes, it is
    followed from its start (out of the channel history, then live) rather than refused
    as busy; once it has ended, 409: a second run under the same id would run the agent
    again and put two executions with one id on the channel."""
    settings = host.node.settings
    try:
        channel = await session_channel(host.node, host.app, request, thread_id)
        async with asyncio.timeout(settings.history_read_timeout):
            last = await last_run(host.node.backend, host.app.id, channel, settings.history_size)
    except (SessionRefused, BackendUnavailable, TimeoutError):
        return None  # starting the run answers these as it always has
    if last is None or last.execution_id != run_id:
        return None
    if not last.going or last.start is None:
        why = "has ended" if not last.going else "started before the channel history reaches"
        return json_error(
            409,
            f"run {run_id!r} of thread {thread_id!r} {why}: a new run needs a new runId "
            f"(its events are on channel {channel!r})",
        )
    handle = RunHandle(thread_id, run_id, channel, str(last.start))
    return _stream(host, run_id, handle, None)


def _stream(host: Host, run_id: str, handle: RunHandle, token: str | None) -> Response:
    since = None if handle.position is None else Position.parse(handle.position)
    info: dict[str, Any] = {
        "session_id": handle.session_id,
        "execution_id": handle.execution_id,
        "channel": handle.channel,
        "position": handle.position,
    }
    headers = dict(_HEADERS)
    # Only the request that started the run gets the session's token: a follower holds
    # at most what reads the channel, and that must not become the owner's token.
    if token is not None:
        info["session_token"] = headers["X-Session-Token"] = token
    mapper = AguiMapper(handle.session_id, run_id, metadata={"broadcaster": info})
    feed = ChannelFeed(host.node, host.app, handle.channel, since)

    async def snapshot() -> Any:
        stored = await host.node.backend.load_value(host.app.id, state_key(handle.channel))
        return None if stored is None else orjson.loads(stored)

    heartbeat = host.node.settings.sse_heartbeat
    body = _events(feed, mapper, handle.execution_id, snapshot, heartbeat)
    return FeedResponse(feed, body, headers, "the run started but its events")


async def _events(
    feed: ChannelFeed,
    mapper: AguiMapper,
    execution_id: str,
    snapshot: SnapshotLoader,
    heartbeat: float,
) -> AsyncIterator[bytes]:
    encoder = EventEncoder()

    def encode(events: list[BaseEvent]) -> bytes:
        return "".join(encoder.encode(event) for event in events).encode()

    while not mapper.done:
        items = await feed.receive(heartbeat)
        if not items and feed.ended is None:
            yield HEARTBEAT
            continue
        # What came before the feed ended is sent first (it may hold the run's end).
        events: list[BaseEvent] = []
        for item in items:
            events += await _translate(item, mapper, execution_id, snapshot)
        if events:
            yield encode(events)
        if feed.ended is not None and not mapper.done:
            yield encode(mapper.error(f"the stream fell behind the run: {feed.ended}"))
            return


async def _translate(
    item: FeedItem, mapper: AguiMapper, execution_id: str, snapshot: SnapshotLoader
) -> list[BaseEvent]:
    if item.event == "broadcaster:resume":
        if orjson.loads(item.data).get("recovered"):
            return []
        return mapper.error("the run's events are no longer in the channel history")
    if not item.event.startswith("agent."):
        return []
    try:
        envelope = env.parse_envelope(item.data)
    except ValueError as exc:  # not ours: published on the channel by someone else
        logger.warning("skipping %s on %s: not an envelope: %s", item.event, execution_id, exc)
        return []
    if envelope.execution_id != execution_id:
        return []  # another run's events on the same session
    final = isinstance(envelope, env.AgentStatus) and envelope.payload.status in _FINAL
    state = None
    if final:
        try:
            state = await snapshot()
        except BackendUnavailable as exc:
            logger.warning("no final state for %s: %s", envelope.session_id, exc)
    return mapper.feed(envelope, state)
