"""The Vercel AI SDK's UI message stream: a run's envelopes as the SSE protocol that
``useChat`` (``ai`` / ``@ai-sdk/react``) consumes.

``POST /vercel-ai`` (``AGENT_DEMO_VERCEL_AI_PATH``) takes the body ``useChat``'s
``DefaultChatTransport`` sends (``{id, messages, trigger, messageId}``; ``id`` is the
session, the last user message's text is the run's input; ``trace`` and ``pace_ms``
may be added with the transport's ``body`` option), starts the run like ``POST /run``
and answers with its envelopes translated (:class:`UIMessageStreamMapper`), read from
``agent.<session>`` like ``POST /ag-ui``: one source of truth, the same run visible over
WebSocket. ``GET /vercel-ai/{session}/stream`` (the transport's ``reconnectToStream``
URL, called by ``useChat``'s ``resumeStream()``) resumes the session's run, whoever runs
it (an ``agent_core`` run, or a framework adapter's), with no gap:

- a run in progress (the last ``agent.status`` in the channel history is
  ``in_progress``, :func:`active_run`) is replayed from that status out of the history
  and continues live (the hub's seam: no gap, no duplicate);
- ``?since=<position>`` / ``Last-Event-ID``: the parts of what comes after it;
- no run in progress: 204, which ``reconnectToStream`` reads as "no active stream";
- the run's start (or ``since``) no longer in the history: ``start``, ``error``,
  ``finish``, so the client reloads the state instead of keeping a partial message.

With private sessions (``AGENT_DEMO_PRIVATE_SESSIONS``) the ``POST`` that starts a run
answers with the session's token in ``X-Session-Token`` (``POST /run`` puts it in its
body); the ``GET`` never does: it reads with the credentials it was given.

Protocol (checked against ``ai`` 7's ``uiMessageChunkSchema`` and
``UI_MESSAGE_STREAM_HEADERS``): ``data: <chunk JSON>\\n\\n`` per chunk, ``data: [DONE]``
at the end, header ``x-vercel-ai-ui-message-stream: v1``.

=====================================  ===============================================
envelope                               UI message chunks
=====================================  ===============================================
first envelope of the run              ``start`` (``messageId`` = execution id,
                                       ``messageMetadata``: session, execution, channel)
``agent.step.started``                 ``start-step``
``agent.stream.chunk``                 ``text-start`` (first chunk of a text),
                                       ``text-delta``, ``text-end`` (``is_complete``, or
                                       before a tool call / step end)
``agent.tool.started``                 ``tool-input-start``, ``tool-input-available``
                                       (the real ``toolCallId``, the arguments;
                                       ``dynamic``: the client does not declare them)
``agent.tool.completed``               ``tool-output-available`` (result summary) or
                                       ``tool-output-error``
a routed run's phase (tool name in     ``data-routing`` (id ``<message>:routing-<call>``,
``ROUTING_PHASES``) started /          so the completion replaces the start; data: the
completed                              tool envelope's payload and ``state``): not a
                                       tool call
``agent.continuation``                 ``data-continuation`` (the full decision)
``agent.step.completed``               ``data-continuation`` (its summary, unless the
                                       full one was sent), ``finish-step``
``agent.status`` completed             a text of ``last_response`` when the run
                                       streamed none of its own (a routed run),
                                       ``message-metadata`` (``usage``: the run's own
                                       tokens, its steps' sum, as ``inputTokens`` /
                                       ``outputTokens`` / ``totalTokens``),
                                       ``data-state`` (the stored snapshot, if any),
                                       ``data-status`` (the status payload), ``finish``
``agent.status`` failed                ``message-metadata``, ``data-state`` if stored,
                                       ``data-status``, ``error``, ``finish``
                                       (``finishReason: error``)
=====================================  ===============================================

A run nested in this one (a routed capability's inner agent, its own execution id) is
left out: its work is the capability's tool call, and its answer is the run's.

Errors before the stream starts are JSON ``{"error": ...}`` with the statuses of
``POST /ag-ui`` (413, 408, 422, 403, 409, 503, 429).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, Protocol, assert_never

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from agent_core.app._gate import GATED_METHODS, run_gate
from agent_core.app._streams import (
    FeedResponse,
    RunHost,
    envelope_of,
    json_error,
    last_run,
    start_run,
)
from agent_core.app.runs import RunRequest
from broadcaster import envelope as env
from broadcaster.backends.base import BackendUnavailable
from broadcaster.cors import READ_METHODS, cross_origin
from broadcaster.http_input import BodyRefused, describe_validation, read_body, validation_details
from broadcaster.publication import Position
from broadcaster.publishers import state_key
from broadcaster.sessions import (
    SessionRefused,
    session_channel,
)
from broadcaster.sse import HEARTBEAT, ChannelFeed, FeedItem, resume_position

__all__ = [
    "DONE",
    "HEADERS",
    "VERCEL_AI_PATH",
    "ChatRequest",
    "UIMessageStreamMapper",
    "encode_chunk",
    "routes",
]

logger = logging.getLogger(__name__)

VERCEL_AI_PATH = "/vercel-ai"
HEADERS = {
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
    "x-vercel-ai-ui-message-stream": "v1",
}
DONE = b"data: [DONE]\n\n"
_FINAL = ("completed", "failed")
_FINISH_REASONS = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "tool-calls",
    "content_filter": "content-filter",
    "error": "error",
}
Chunk = dict[str, Any]


def encode_chunk(chunk: Chunk) -> bytes:
    """One SSE event carrying ``chunk`` as JSON."""
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


# -- input ----------------------------------------------------------------------------


class UIMessageIn(BaseModel):
    """A ``UIMessage`` as ``useChat`` sends it (only what the server reads is checked)."""

    model_config = ConfigDict(extra="allow")

    id: str = ""
    role: Literal["system", "user", "assistant"]
    parts: list[dict[str, Any]] = Field(default_factory=list)


class ChatRequest(BaseModel):
    """The body of ``DefaultChatTransport``'s request, plus ``trace`` / ``pace_ms``."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1, description="the chat id: the session")
    messages: list[UIMessageIn] = Field(min_length=1, max_length=1000)
    trigger: str | None = None
    messageId: str | None = None  # the SDK's name
    trace: bool = True
    pace_ms: int | None = None

    def run_request(self) -> RunRequest:
        """The run this chat request asks for.

        Raises:
            ValueError: no user message with text.
            ValidationError: a field our runs do not accept.
        """
        fields: dict[str, Any] = {
            "input": self._last_user_text(),
            "session_id": self.id,
            "execution_id": uuid.uuid4().hex,
            "trace": self.trace,
        }
        if self.pace_ms is not None:
            fields["pace_ms"] = self.pace_ms
        return RunRequest.model_validate(fields)

    def _last_user_text(self) -> str:
        for message in reversed(self.messages):
            if message.role != "user":
                continue
            texts = [p.get("text", "") for p in message.parts if p.get("type") == "text"]
            if not all(isinstance(t, str) for t in texts):
                # Not str(): a list nested 1,000 deep raised RecursionError (a 500).
                raise ValueError("messages: a text part's text must be a string")
            text = "".join(texts)
            if text.strip():
                return text
        raise ValueError("messages: no user message with a text part (the run's input)")


# -- envelopes to UI message chunks (sans I/O) ----------------------------------------


class UIMessageStreamMapper:
    """Translates one run's envelopes, in channel order, into UI message chunks that
    ``readUIMessageStream`` accepts (every text and step opened is closed before
    ``finish``).

    Args:
        message_id: the assistant message's id (the execution id).
        metadata: sent as ``messageMetadata`` with ``start``.
    """

    def __init__(self, message_id: str, metadata: dict[str, Any] | None = None) -> None:
        self.message_id = message_id
        self.metadata = metadata
        self.started = False
        self.done = False
        self._texts = 0
        self._text: str | None = None
        self._steps: list[int] = []
        self._traced: set[int] = set()
        self._usage: list[env.UsagePayload] = []

    def feed(self, envelope: env.Envelope, snapshot: Any = None) -> list[Chunk]:
        """The chunks for ``envelope``; ``snapshot``: the stored state, with the final
        status."""
        if self.done:
            return []
        chunks = [] if self.started else [self._start()]
        match envelope:
            case env.AgentStatus():
                chunks += self._status(envelope.payload, snapshot)
            case env.StepStarted():
                self._steps.append(envelope.payload.step_number)
                chunks.append({"type": "start-step"})
            case env.StepCompleted():
                self._usage.append(envelope.payload.usage)
                chunks += self._step_finished(envelope.payload)
            case env.StreamChunk():
                chunks += self._chunk(envelope.payload)
            case env.ToolStarted() | env.ToolCompleted() if (
                envelope.payload.tool_name in env.ROUTING_PHASES
            ):
                chunks.append(self._phase(envelope.payload))
            case env.ToolStarted():
                chunks += self._tool_started(envelope.payload)
            case env.ToolCompleted():
                chunks.append(self._tool_result(envelope.payload))
            case env.AgentContinuation():
                self._traced.add(envelope.payload.step_number)
                number = envelope.payload.step_number
                data = envelope.payload.model_dump(mode="json")
                chunks.append(self._data("continuation", data, f"continuation-{number}"))
            case _:
                assert_never(envelope)
        return chunks

    def error(self, message: str) -> list[Chunk]:
        """End the stream with ``error`` and ``finish`` (its events can no longer be read)."""
        if self.done:
            return []
        self.done = True
        opening = [] if self.started else [self._start()]
        return [*opening, *self._close_all(), {"type": "error", "errorText": message},
                {"type": "finish", "finishReason": "error"}]  # fmt: skip

    def _start(self) -> Chunk:
        self.started = True
        chunk: Chunk = {"type": "start", "messageId": self.message_id}
        if self.metadata is not None:
            chunk["messageMetadata"] = self.metadata
        return chunk

    def _data(self, name: str, data: Any, key: str | None = None) -> Chunk:
        return {"type": f"data-{name}", "id": f"{self.message_id}:{key or name}", "data": data}

    def _status(self, payload: env.StatusPayload, snapshot: Any) -> list[Chunk]:
        if payload.status not in _FINAL:
            return []
        self.done = True
        chunks = self._close_text()
        if not self._texts and payload.status == "completed" and payload.last_response:
            chunks += self._answer(payload.last_response)
        chunks += self._close_all()
        usage = env.run_usage(self._usage, payload.usage)
        if usage is not None:
            chunks.append({"type": "message-metadata", "messageMetadata": {"usage": _usage(usage)}})
        if snapshot is not None:
            chunks.append(self._data("state", snapshot))
        chunks.append(self._data("status", payload.model_dump(mode="json", exclude_none=True)))
        if payload.status == "failed":
            chunks.append({"type": "error", "errorText": payload.error_message or "the run failed"})
            return [*chunks, {"type": "finish", "finishReason": "error"}]
        return [*chunks, {"type": "finish", "finishReason": "stop"}]

    def _answer(self, text: str) -> list[Chunk]:
        """The run's answer as one text: a run that streamed no text of its own (a
        routed run answers through its capability) still shows a reply."""
        self._texts += 1
        part = f"{self.message_id}:text-{self._texts}"
        return [{"type": "text-start", "id": part}, {"type": "text-delta", "id": part,
                "delta": text}, {"type": "text-end", "id": part}]  # fmt: skip

    def _phase(self, payload: env.ToolStartedPayload | env.ToolCompletedPayload) -> Chunk:
        """A routed run's phase (classifier, decider, memory): shown as such, not as a
        tool call of the agent; its completion replaces its start (same id)."""
        state = "running" if isinstance(payload, env.ToolStartedPayload) else "done"
        data = {"state": state, **payload.model_dump(mode="json", exclude_none=True)}
        return self._data("routing", data, f"routing-{payload.tool_call_id}")

    def _step_finished(self, payload: env.StepCompletedPayload) -> list[Chunk]:
        chunks = self._close_text()
        number = payload.step_number
        if payload.continuation is not None and number not in self._traced:
            summary = {"step_number": number, **payload.continuation.model_dump(mode="json")}
            chunks.append(self._data("continuation", summary, f"continuation-{number}"))
        if number in self._steps:
            self._steps.remove(number)
            chunks.append({"type": "finish-step"})
        return chunks

    def _chunk(self, payload: env.StreamChunkPayload) -> list[Chunk]:
        chunks: list[Chunk] = []
        if self._text is None and payload.chunk:
            self._texts += 1
            self._text = f"{self.message_id}:text-{self._texts}"
            chunks.append({"type": "text-start", "id": self._text})
        if self._text is not None and payload.chunk:
            chunks.append({"type": "text-delta", "id": self._text, "delta": payload.chunk})
        if payload.is_complete:
            chunks += self._close_text()
        return chunks

    def _close_text(self) -> list[Chunk]:
        if self._text is None:
            return []
        text, self._text = self._text, None
        return [{"type": "text-end", "id": text}]

    def _close_all(self) -> list[Chunk]:
        chunks = self._close_text() + [{"type": "finish-step"} for _ in self._steps]
        self._steps.clear()
        return chunks

    def _tool_started(self, payload: env.ToolStartedPayload) -> list[Chunk]:
        call, name = payload.tool_call_id, payload.tool_name
        common = {"toolCallId": call, "toolName": name, "dynamic": True}
        return [
            *self._close_text(),
            {"type": "tool-input-start", **common},
            {"type": "tool-input-available", **common, "input": payload.arguments or {}},
        ]

    def _tool_result(self, payload: env.ToolCompletedPayload) -> Chunk:
        call = payload.tool_call_id
        if payload.success:
            output = payload.result_summary or ""
            return {"type": "tool-output-available", "toolCallId": call, "output": output,
                    "dynamic": True}  # fmt: skip
        error = payload.error or "the tool failed"
        return {"type": "tool-output-error", "toolCallId": call, "errorText": error,
                "dynamic": True}  # fmt: skip


# -- the endpoints --------------------------------------------------------------------


class _Settings(Protocol):
    @property
    def private_sessions(self) -> bool: ...

    @property
    def vercel_ai_path(self) -> str: ...


class Host(RunHost, Protocol):
    """What the endpoint needs from the extension that serves it (the demo)."""

    @property
    def settings(self) -> _Settings: ...


SnapshotLoader = Callable[[str], Awaitable[Any]]


def routes(host: Host) -> list[Route]:
    """``POST <path>`` (start a run) and ``GET <path>/{session}/stream`` (follow)."""
    path = host.settings.vercel_ai_path.rstrip("/")

    async def chat(request: Request) -> Response:
        return await _chat(host, request)

    async def follow(request: Request) -> Response:
        return await _follow(host, request)

    return [
        Route(path, run_gate(host, chat), methods=GATED_METHODS, name="vercel-ai"),
        Route(
            path + "/{session_id}/stream",
            cross_origin(follow, lambda request: host.app),
            methods=READ_METHODS,
            name="vercel-ai-follow",
        ),
    ]


async def _chat(host: Host, request: Request) -> Response:
    settings = host.node.settings
    try:
        body = await read_body(request, settings.max_request_bytes, settings.body_timeout)
        chat = ChatRequest.model_validate(orjson.loads(body))
        wanted = chat.run_request()
    except BodyRefused as exc:
        return json_error(exc.status, exc.message)
    except orjson.JSONDecodeError as exc:
        return json_error(422, f"the body must be a JSON chat request: {exc}")
    except ValidationError as exc:
        return json_error(
            422, describe_validation(exc, "chat request"), details=validation_details(exc)
        )
    except ValueError as exc:
        return json_error(422, f"invalid chat request: {exc}")
    started = await start_run(host, request, chat.id, wanted, "chat")
    if isinstance(started, Response):
        return started
    handle = started.handle
    since = None if handle.position is None else Position.parse(handle.position)
    headers = _started_headers(started.token)
    return _stream(host, handle.session_id, handle.channel, since, handle.execution_id, headers)


async def _follow(host: Host, request: Request) -> Response:
    session_id = request.path_params["session_id"]
    try:
        since = resume_position(request)
        channel = await session_channel(host.node, host.app, request, session_id)
        settings = host.node.settings
        async with asyncio.timeout(settings.history_read_timeout):
            run = await last_run(
                host.node.backend, host.app.id, channel, settings.history_size, until=since
            )
    except SessionRefused as exc:
        return json_error(exc.status, str(exc))
    except BackendUnavailable as exc:
        return json_error(503, str(exc))
    except TimeoutError:
        return json_error(503, f"the history of {channel!r} could not be read in time")
    if run is not None and not run.going:
        run = None
    if run is None and since is not None:  # no run going at ``since``: the next one
        return _stream(host, session_id, channel, since, None, HEADERS, mid_run=True)
    if run is None:
        return Response(status_code=204)  # DefaultChatTransport: "no active stream"
    if run.start is None:
        return _lost_start(session_id, channel, run.execution_id)
    # The run from its start; after ``since`` only what follows it, as the whole stream
    # would go on (no second ``start``, parts opened before it continued, not reopened).
    return _stream(
        host, session_id, channel, run.start, run.execution_id, HEADERS, skip_through=since
    )


def _lost_start(session_id: str, channel: str, execution_id: str) -> Response:
    """A run whose start is no longer in the history: ``start``, ``error``, ``finish``,
    so that the client reloads the state instead of showing a partial message."""
    info = {"session_id": session_id, "channel": channel, "execution_id": execution_id}
    mapper = UIMessageStreamMapper(execution_id, info)
    message = (
        "the run's start is no longer in the channel history: reload the session's state "
        "(its stored snapshot) instead of this stream"
    )
    return Response(_encode(mapper.error(message)) + DONE, 200, HEADERS, "text/event-stream")


def _started_headers(token: str | None) -> dict[str, str]:
    """The headers of the stream of a run this request started: with private sessions,
    the session's token (``token``), as ``POST /run`` answers it. Only the start hands
    it out: a follower holds at most what reads the channel (``?auth=``), or nothing on
    a session nobody has started yet, and neither may become the owner's token."""
    headers = dict(HEADERS)
    if token is not None:
        headers["X-Session-Token"] = token
    return headers


def _stream(
    host: Host,
    session_id: str,
    channel: str,
    since: Position | None,
    execution_id: str | None,
    headers: dict[str, str],
    *,
    mid_run: bool = False,
    skip_through: Position | None = None,
) -> Response:
    """The run from ``since`` on: ``execution_id``'s, or (None) the first run whose
    ``in_progress`` comes, or with ``mid_run`` the run of the first envelope that comes;
    the chunks of envelopes up to ``skip_through`` are not sent."""
    feed = ChannelFeed(host.node, host.app, channel, since)

    async def snapshot(key: str) -> Any:
        stored = await host.node.backend.load_value(host.app.id, state_key(key))
        return None if stored is None else orjson.loads(stored)

    info = {"session_id": session_id, "channel": channel}
    heartbeat = host.node.settings.sse_heartbeat
    body = _chunks(feed, info, execution_id, snapshot, heartbeat, mid_run, skip_through)
    return FeedResponse(feed, body, headers, "the session's events")


async def _chunks(
    feed: ChannelFeed,
    info: dict[str, Any],
    execution_id: str | None,
    snapshot: SnapshotLoader,
    heartbeat: float,
    mid_run: bool = False,
    skip_through: Position | None = None,
) -> AsyncIterator[bytes]:
    mapper: UIMessageStreamMapper | None = None
    skipping = skip_through is not None
    if execution_id is not None:
        mapper = UIMessageStreamMapper(execution_id, {**info, "execution_id": execution_id})
    while mapper is None or not mapper.done:
        items = await feed.receive(heartbeat)
        if not items and feed.ended is None:
            yield HEARTBEAT
            continue
        # What came before the feed ended is sent first (it may hold the run's end).
        out: list[Chunk] = []
        for item in items:
            if item.event == "broadcaster:resume" and not orjson.loads(item.data).get("recovered"):
                mapper = mapper or UIMessageStreamMapper(uuid.uuid4().hex, info)
                out += mapper.error("the run's events are no longer in the channel history")
                continue
            envelope = _envelope(item)
            if envelope is None:
                continue
            if mapper is None:
                if not (mid_run or _run_start(envelope)):
                    continue  # following: wait for the next run's start
                # A nested run's envelope belongs to the run it serves.
                run = envelope.payload.parent_execution_id or envelope.execution_id
                mapper = UIMessageStreamMapper(run, {**info, "execution_id": run})
            chunks = await _translate(envelope, mapper, snapshot, feed.channel)
            if skipping:  # read to know the message so far, not sent again
                assert skip_through is not None
                skipping = not _after(item.position, skip_through)
                if skipping:
                    continue
            out += chunks
        if out:
            yield _encode(out)
        if feed.ended is not None and not (mapper is not None and mapper.done):
            mapper = mapper or UIMessageStreamMapper(uuid.uuid4().hex, info)
            yield _encode(mapper.error(f"the stream fell behind the run: {feed.ended}"))
            break
    yield DONE


def _after(position: str | None, mark: Position) -> bool:
    """Whether a publication at ``position`` (as a feed gives it) comes after ``mark``."""
    if position is None:
        return False
    at = Position.parse(position)
    return at.epoch != mark.epoch or at.offset > mark.offset


def _run_start(envelope: env.Envelope) -> bool:
    """A run's ``in_progress``, not a nested run's (that is part of the run it serves)."""
    return (
        isinstance(envelope, env.AgentStatus)
        and envelope.payload.status == "in_progress"
        and envelope.payload.parent_execution_id is None
    )


def _usage(usage: env.UsagePayload) -> dict[str, int]:
    """Tokens as the AI SDK names them (``LanguageModelUsage``)."""
    return {
        "inputTokens": usage.prompt,
        "outputTokens": usage.completion,
        "totalTokens": usage.total,
    }


def _envelope(item: FeedItem) -> env.Envelope | None:
    return envelope_of(item.event, item.data)


async def _translate(
    envelope: env.Envelope, mapper: UIMessageStreamMapper, snapshot: SnapshotLoader, channel: str
) -> list[Chunk]:
    if envelope.execution_id != mapper.message_id:
        return []  # another run's events on the same session
    state = None
    if isinstance(envelope, env.AgentStatus) and envelope.payload.status in _FINAL:
        try:
            state = await snapshot(channel)
        except BackendUnavailable as exc:
            logger.warning("no final state for %s: %s", envelope.session_id, exc)
    return mapper.feed(envelope, state)


def _encode(chunks: list[Chunk]) -> bytes:
    return b"".join(encode_chunk(chunk) for chunk in chunks)
