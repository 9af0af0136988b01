"""The envelope adapter (docs/protocol.md, the envelope): agent events in,
envelopes on ``agent.<session>`` out.

:class:`AgentEventAdapter` listens to an agent's events and publishes one envelope per
lifecycle event through a :class:`broadcaster.publishers.Publisher`. It keeps
``agent.status`` in step with the run (``in_progress`` on start, ``completed`` /
``failed`` at the end, after the final state was stored for reconcile), summarises tool
arguments and results, and coalesces streamed text so that a fast model does not
become one publish per token.

Streamed text is published in chunks of at most ``max_chunk_bytes`` (as JSON, 8 KiB by
default): coalescing stops there, and a longer delta is split into consecutive chunks,
between characters. So one large model answer never becomes a publication that a
Pusher event (10,240 bytes of data) or a subscriber's buffer cannot take; viewers join
a step's chunks in ``chunk_index`` order and get the text exactly.

Ordering: envelopes are published one at a time, in event order, under one lock; the
flush of coalesced text takes the same lock, so text never overtakes the event that
followed it.

Held text is flushed by one timer per event loop, shared by every adapter of the
process (:class:`_SharedFlusher`): when it fires, it flushes the held text of every
adapter that holds some, in one task, so a process running many sessions publishes
their text together (one batch, one round trip for a buffered publisher) instead of
one timer, one task and one round trip per adapter and chunk. Text is still held at
most ``coalesce_seconds``: the timer is due when the oldest held text is.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from agent_core import events as ev
from agent_core.builder import AgentBuilder
from agent_core.continuation import ContinuationOutcome
from agent_core.hooks import HookPoint
from agent_core.messages import Usage
from agent_core.state import AgentState
from broadcaster import envelope as env
from broadcaster.publishers import Publisher

__all__ = [
    "AdapterOptions",
    "AgentEventAdapter",
    "EnvelopeEmitter",
    "FinalStateHook",
    "FinalStateRefused",
    "encode_final_state",
    "json_text",
    "publishable_end",
    "split_text",
    "summarize_args",
    "summarize_result",
    "text_size",
    "usage_payload",
]

logger = logging.getLogger(__name__)

FinalStateHook = Callable[[AgentState], Awaitable[str | None]]
"""Called with the final state before the final ``agent.status``; stores it and returns
the URL where it can be fetched (or None). Raises :class:`FinalStateRefused` when the
state could not be stored as it was: the run then ends ``failed``."""

_ENDS = ("completed", "failed")


class FinalStateRefused(Exception):
    """A final state could not be stored as it was (JSON cannot carry it: an integer
    past 64 bits, text that is not UTF-8): the run's final status is ``failed`` with
    this message. ``state_url``: where the failed state stored instead is (None:
    none)."""

    def __init__(self, message: str, state_url: str | None = None) -> None:
        super().__init__(message)
        self.state_url = state_url


def _unencodable(what: str, where: list[str], done: str) -> str:
    places = ", ".join(where[:5]) + (f" and {len(where) - 5} more" if len(where) > 5 else "")
    return f"the run's final {what} held what JSON cannot carry ({places}): {done}"


def encode_final_state(snapshot: dict[str, Any]) -> tuple[bytes, str | None]:
    """A run's final slim snapshot as it is stored: its JSON and None; or, when JSON
    cannot carry it (an integer past 64 bits, text that is not UTF-8), the JSON of it
    ``failed``, those values replaced (:func:`~broadcaster.envelope.wire_safe`), and
    the reason, which the run's final status then says.

    Raises:
        TypeError: it holds something that is not JSON-like at all.
    """
    try:
        return orjson.dumps(snapshot), None
    except (TypeError, ValueError):
        pass
    kept, where = env.wire_safe(snapshot)
    reason = _unencodable("state", where, "stored as failed, those values replaced")
    kept.update(status="failed", error_message=reason)
    return orjson.dumps(kept), reason


def publishable_end(envelope: env.AgentStatus) -> env.AgentStatus:
    """A run's final ``agent.status`` as it can be published: itself, or, when JSON
    cannot carry it (orjson writes no integer past 64 bits and no text that is not
    UTF-8), ``failed`` saying why, with those values replaced (:func:`~broadcaster.
    envelope.wire_safe`). Followers must always see a run's end."""
    try:
        envelope.to_json()
        return envelope
    except (TypeError, ValueError):
        pass
    data, where = env.wire_safe(envelope.model_dump(mode="json"))
    payload = data["payload"]
    reason = _unencodable("status", where, "published as failed, those values replaced")
    earlier = payload.get("error_message")
    payload.update(
        status="failed",
        stop_reason="error",
        error_message=reason if not earlier else f"{earlier}; {reason}",
    )
    logger.error("session %s: %s", envelope.session_id, reason)
    return env.AgentStatus.model_validate(data)


@dataclass(frozen=True)
class AdapterOptions:
    """What the adapter publishes and how.

    Args:
        include_continuation_trace: publish ``agent.continuation`` with every
            evaluation (the debugging view); off by default.
        include_step_continuation: add the continuation summary (should_continue,
            stop_reason, resolved_by) to ``agent.step.completed``.
        include_stream_chunks: publish ``agent.stream.chunk``.
        redact_tool_args: replace argument values with ``[redacted]`` in summaries.
        summary_length: longest result summary (longer ones end in ``...``).
        arg_value_length: longest single argument value in an argument summary.
        max_summary_args: how many arguments an argument summary shows.
        max_arguments_bytes: ``agent.tool.started`` carries a call's full arguments
            when their JSON is at most this long, else ``null`` (the summary stays):
            an envelope must fit a Pusher event (10,240 bytes of data) and a
            subscriber's buffer.
        coalesce_seconds: longest time streamed text is held before it is published.
        coalesce_deltas: text deltas that trigger a publish before the delay ends.
        max_chunk_bytes: longest text of one ``agent.stream.chunk``, in bytes of its
            JSON string (:func:`text_size`): held text is published before it would
            grow past it, and a longer delta is split into consecutive chunks. With the
            envelope's other fields (at most about 400 bytes) a chunk fits a Pusher
            event (10,240 bytes of data) and is far below a subscriber's buffer.
    """

    include_continuation_trace: bool = False
    include_step_continuation: bool = True
    include_stream_chunks: bool = True
    redact_tool_args: bool = False
    summary_length: int = 100
    arg_value_length: int = 30
    max_summary_args: int = 3
    max_arguments_bytes: int = 8_192
    coalesce_seconds: float = 0.05
    coalesce_deltas: int = 16
    max_chunk_bytes: int = 8_192

    def __post_init__(self) -> None:
        for name in ("summary_length", "arg_value_length", "coalesce_deltas"):
            if getattr(self, name) < 4:
                raise ValueError(f"{name} must be at least 4, got {getattr(self, name)!r}")
        if self.max_chunk_bytes < _MIN_CHUNK_BYTES:
            raise ValueError(
                f"max_chunk_bytes must be at least {_MIN_CHUNK_BYTES}, got {self.max_chunk_bytes!r}"
            )
        if self.coalesce_seconds < 0 or self.max_summary_args < 0 or self.max_arguments_bytes < 0:
            raise ValueError(
                "coalesce_seconds, max_summary_args and max_arguments_bytes cannot be negative"
            )


_MIN_CHUNK_BYTES = 64  # room for any character: at most 12 bytes as JSON (a surrogate pair)


def text_size(text: str) -> int:
    """The bytes ``text`` takes as a JSON string in an envelope (UTF-8, with escapes,
    without the quotes)."""
    try:
        return len(orjson.dumps(text)) - 2
    except TypeError:  # lone surrogates (orjson refuses them): as json writes them
        return len(json.dumps(text).encode()) - 2


def split_text(text: str, limit: int) -> list[str]:
    """``text`` in consecutive pieces of at most ``limit`` bytes each as JSON strings
    (:func:`text_size`), cut between characters and never between the two halves of a
    surrogate pair; joined, they are ``text``. ``limit`` must be at least 12."""
    pieces: list[str] = []
    start, length = 0, len(text)
    while start < length:
        end = min(length, start + limit)  # a character takes at least one byte
        if text_size(text[start:end]) > limit:
            end = _longest_fit(text, start, end, limit)
        if end < length and _is_pair(text, end):
            end += -1 if end - start > 1 else 1  # keep the pair together
        pieces.append(text[start:end])
        start = end
    return pieces


def _longest_fit(text: str, start: int, end: int, limit: int) -> int:
    """The last ``stop`` in ``(start, end)`` with ``text[start:stop]`` within ``limit``
    (one character always is), knowing that ``text[start:end]`` is not."""
    fits, over = start + 1, end
    while over - fits > 1:
        middle = (fits + over) // 2
        if text_size(text[start:middle]) <= limit:
            fits = middle
        else:
            over = middle
    return fits


def _is_pair(text: str, at: int) -> bool:
    """Whether ``text[at - 1 : at + 1]`` is a high and a low surrogate."""
    return "\ud800" <= text[at - 1] <= "\udbff" and "\udc00" <= text[at] <= "\udfff"


def _bounded(args: Mapping[str, Any], limit: int) -> dict[str, Any] | None:
    """``args`` as a dict, or None when their JSON is longer than ``limit`` bytes or
    JSON cannot carry them (an integer past 64 bits: a framework's, not bounded)."""
    try:
        size = len(orjson.dumps(args, default=str))
    except TypeError:
        return None
    return dict(args) if size <= limit else None


def json_text(value: Any) -> str:
    """``value`` as JSON text (``str()`` of what JSON has no form for), even when JSON
    cannot carry it as it is: then with those values replaced
    (:func:`~broadcaster.envelope.wire_safe`). For summaries and texts that must not
    fail on a framework's or tool's data."""
    try:
        return orjson.dumps(value, default=str).decode()
    except TypeError:
        return orjson.dumps(env.wire_safe(value)[0], default=str).decode()


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def summarize_args(
    args: Mapping[str, Any], *, max_args: int = 3, value_length: int = 30, redact: bool = False
) -> str:
    """``key: 'text', n: 3`` for the first ``max_args`` arguments."""
    parts = []
    for key, value in list(args.items())[:max_args]:
        if redact:
            shown = "[redacted]"
        elif isinstance(value, str):
            shown = _clip(f"'{value}'", value_length)
        else:
            shown = _clip(json_text(value), value_length)
        parts.append(f"{key}: {shown}")
    if len(args) > max_args:
        parts.append(f"(+{len(args) - max_args} more)")
    return ", ".join(parts)


def summarize_result(result: Any, length: int = 100) -> str | None:
    """The result as text, cut to ``length`` characters with ``...``."""
    if result is None:
        return None
    return _clip(result if isinstance(result, str) else json_text(result), length)


class EnvelopeEmitter:
    """What every adapter shares: envelopes published one at a time in event order
    under one lock, their ids and timestamps, streamed text coalesced by count and by
    a timer, and the payloads that do not depend on who emits them. Subclasses map
    their events in :meth:`_dispatch`.

    Args:
        publisher: where envelopes go.
        session_id: the session; the channel is ``channel`` or ``agent.<session_id>``.
        execution_id: the envelopes' execution id; when None, each event's own.
        options: what to publish (see :class:`AdapterOptions`).
        channel: publish here instead of ``agent.<session_id>`` (e.g. a private one).
        parent: ``(execution id, tool call id)`` of the run and call this one runs
            inside (a nested run): every payload names them (``parent_execution_id``,
            ``parent_tool_call_id``).
    """

    def __init__(
        self,
        publisher: Publisher,
        session_id: str,
        execution_id: str | None = None,
        *,
        options: AdapterOptions | None = None,
        channel: str | None = None,
        parent: tuple[str, str] | None = None,
    ) -> None:
        self.parent = parent
        self.publisher = publisher
        self.session_id = session_id
        self.execution_id = execution_id
        self.options = options or AdapterOptions()
        self.channel = channel or env.channel_for(session_id)
        self.failures = 0
        self.finished = False
        self._lock = asyncio.Lock()
        self._last_event: ev.AgentEvent | None = None
        self._chunks: list[str] = []
        self._chunk_bytes = 0  # text_size of the held text
        self._chunk_step: int | None = None
        self._chunk_index = 0
        self._flusher: _SharedFlusher | None = None  # set while text waits for it
        self._home: tuple[asyncio.AbstractEventLoop, _SharedFlusher] | None = None
        self._timer_tasks: set[asyncio.Task[None]] = set()

    async def on_event(self, event: ev.AgentEvent) -> None:
        """The listener: map one event to zero or more envelopes."""
        self._last_event = event
        if isinstance(event, ev.StreamChunk):
            await self._on_chunk(event)
            return
        async with self._lock:
            await self._flush_chunks(complete=False)
            await self._dispatch(event)

    async def _dispatch(self, event: ev.AgentEvent) -> None:
        """Publish the envelopes of one (non-chunk) event; the caller holds the lock."""
        raise NotImplementedError

    async def fail(self, message: str, state_url: str | None = None) -> None:
        """Publish a final ``failed`` status for a run that ended without one (it
        crashed outside the loop, or its worker died), unless the run already ended.
        ``state_url``: where a final state was stored, if one was."""
        if self.finished:
            return
        async with self._lock:
            await self._flush_chunks(complete=False)
            payload = env.StatusPayload(
                status="failed", error_message=message, stop_reason="error", state_url=state_url
            )
            self.finished = True
            await self._publish(env.AgentStatus(**self._ids(), payload=payload))

    async def aclose(self) -> None:
        """Publish held text and wait for timer flushes."""
        async with self._lock:
            await self._flush_chunks(complete=False)
        flushing = _SharedFlusher.running()
        if flushing is not None and flushing is not asyncio.current_task():
            await asyncio.gather(flushing, return_exceptions=True)
        if self._timer_tasks:
            await asyncio.gather(*self._timer_tasks, return_exceptions=True)

    # -- payloads shared by every emitter -------------------------------------------------

    async def _tool_started(
        self, event: ev.AgentEvent, call_id: str, name: str, args: Mapping[str, Any]
    ) -> None:
        o = self.options
        payload = env.ToolStartedPayload(
            tool_name=name,
            tool_call_id=call_id,
            args_summary=summarize_args(
                args,
                max_args=o.max_summary_args,
                value_length=o.arg_value_length,
                redact=o.redact_tool_args,
            ),
            step_number=_step(event),
            arguments=None if o.redact_tool_args else _bounded(args, o.max_arguments_bytes),
        )
        await self._emit(env.ToolStarted, event, payload)

    async def _tool_completed(
        self,
        event: ev.AgentEvent,
        call_id: str,
        name: str,
        *,
        success: bool,
        error: str | None,
        duration_ms: float,
        result: Any,
    ) -> None:
        payload = env.ToolCompletedPayload(
            tool_name=name,
            tool_call_id=call_id,
            success=success,
            error=error,
            duration_ms=max(duration_ms, 0.0),
            result_summary=summarize_result(result, self.options.summary_length),
            step_number=_step(event),
        )
        await self._emit(env.ToolCompleted, event, payload)

    async def _call_completed(self, event: ev.ToolCallCompleted) -> None:
        await self._tool_completed(
            event,
            event.tool_call_id,
            event.tool_name,
            success=event.success,
            error=event.error,
            duration_ms=event.duration_ms,
            result=event.result,
        )

    async def _continuation(
        self, event: ev.AgentEvent, step_number: int, outcome: ContinuationOutcome
    ) -> None:
        if not self.options.include_continuation_trace:
            return
        payload = env.ContinuationPayload(
            step_number=step_number,
            should_continue=outcome.should_continue,
            stop_reason=outcome.stop_reason.value,
            resolved_by=outcome.resolved_by,
            evaluations=[
                env.ContinuationEvaluationPayload(
                    criterion=e.criterion,
                    decision=e.decision.value,
                    reason=e.reason,
                    stop_reason=None if e.stop_reason is None else e.stop_reason.value,
                )
                for e in outcome.evaluations
            ],
        )
        await self._emit(env.AgentContinuation, event, payload)

    def _summary(self, outcome: ContinuationOutcome) -> env.ContinuationSummary | None:
        if not self.options.include_step_continuation:
            return None
        return env.ContinuationSummary.model_validate(outcome.summary())

    # -- streamed text --------------------------------------------------------------------

    async def _on_chunk(self, event: ev.StreamChunk) -> None:
        if not self.options.include_stream_chunks:
            return
        async with self._lock:
            if self._chunk_step not in (None, event.step_number):
                await self._flush_chunks(complete=False)
            self._chunk_step = event.step_number
            if event.text_delta:
                await self._hold(event.text_delta)
            if event.is_complete or len(self._chunks) >= self.options.coalesce_deltas:
                await self._flush_chunks(complete=event.is_complete)
            elif self._chunks and self._flusher is None:
                loop = asyncio.get_running_loop()
                if self._home is None or self._home[0] is not loop:
                    self._home = (loop, _SharedFlusher.of(loop))
                self._flusher = self._home[1]
                self._flusher.hold(self, self.options.coalesce_seconds)

    async def _hold(self, delta: str) -> None:
        """Hold ``delta`` for coalescing, publishing first what would take the held text
        past ``max_chunk_bytes``: the held text, then all but the last piece of a delta
        that is longer itself (caller holds the lock)."""
        limit = self.options.max_chunk_bytes
        size = text_size(delta)
        if self._chunk_bytes + size > limit:
            await self._flush_chunks(complete=False)
        if size > limit:
            *whole, delta = split_text(delta, limit)
            for piece in whole:  # no delta ends in these: they count none
                await self._publish_chunk(piece, deltas=0, complete=False)
            size = text_size(delta)
        self._chunks.append(delta)
        self._chunk_bytes += size

    def _flush_alone(self) -> None:
        """Flush held text in a task of its own (the shared flusher's way for an adapter
        that is busy, or whose publisher may wait)."""
        task = asyncio.get_running_loop().create_task(self._timer_flush())
        self._timer_tasks.add(task)
        task.add_done_callback(self._timer_tasks.discard)

    async def _timer_flush(self) -> None:
        async with self._lock:
            await self._flush_chunks(complete=False)

    async def _flush_chunks(self, *, complete: bool) -> None:
        """Publish held text (caller holds the lock)."""
        if self._flusher is not None:
            self._flusher.release(self)
            self._flusher = None
        if not self._chunks and not complete:
            return
        text, deltas = "".join(self._chunks), len(self._chunks)
        self._chunks, self._chunk_bytes = [], 0
        await self._publish_chunk(text, deltas=deltas, complete=complete)
        if complete:
            self._chunk_step = None

    async def _publish_chunk(self, text: str, *, deltas: int, complete: bool) -> None:
        payload = env.StreamChunkPayload(
            chunk=text,
            is_complete=complete,
            tokens_delta=deltas,
            chunk_index=self._chunk_index,
            step_number=self._chunk_step or None,
        )
        envelope = env.StreamChunk(**self._ids(), payload=payload)
        self._chunk_index += 1
        await self._publish(envelope)

    # -- publishing -----------------------------------------------------------------------

    def _ids(self, event: ev.AgentEvent | None = None) -> dict[str, str]:
        """Envelope ids; the timestamp is the event's (now without one)."""
        source = event or self._last_event
        execution = self.execution_id or (None if source is None else source.execution_id)
        if not execution:
            raise ValueError(
                "an envelope needs an execution id: the event has none and the adapter "
                "was given none"
            )
        ids = {"session_id": self.session_id, "execution_id": execution}
        if event is not None:
            ids["timestamp"] = env.utc_timestamp(event.occurred_at)
        return ids

    async def _emit(self, model: type[Any], event: ev.AgentEvent, payload: Any) -> None:
        await self._publish(model(**self._ids(event), payload=payload))

    async def _publish(self, envelope: env.Envelope) -> None:
        if self.parent is not None:
            execution, call = self.parent
            link = {"parent_execution_id": execution, "parent_tool_call_id": call}
            envelope = envelope.model_copy(
                update={"payload": envelope.payload.model_copy(update=link)}
            )
        if isinstance(envelope, env.AgentStatus) and envelope.payload.status in _ENDS:
            envelope = publishable_end(envelope)
        try:
            await self.publisher.broadcast(self.channel, envelope)
        except Exception:
            # The run must not die because its audience cannot be reached; the
            # publisher counts and logs what it could not deliver.
            self.failures += 1
            logger.exception("could not publish %s for session %s", envelope.type, self.session_id)


class _SharedFlusher:
    """The one timer of an event loop that flushes the held text of every emitter.

    An emitter that starts holding text calls :meth:`hold` with its delay; the timer is
    due at the earliest deadline. When it fires, every emitter still holding text is
    flushed, in one task for all those whose lock is free and whose publisher never
    waits (a buffered publisher only enqueues): each flush then runs without a pause,
    so together they are one batch for the publisher. A busy emitter (its lock held,
    e.g. while its final state is stored) or one whose publisher may wait (a network
    round trip per publication) is flushed in a task of its own, as it does not hold
    up the others.
    """

    def __init__(self) -> None:
        # No reference to its loop: the loop is the key of its entry in _FLUSHERS.
        self._held: dict[EnvelopeEmitter, None] = {}  # in the order they began holding
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> _SharedFlusher:
        """``loop``'s flusher (emitters keep theirs: a weak-key lookup costs a weak
        reference)."""
        flusher = _FLUSHERS.get(loop)
        if flusher is None:
            flusher = _FLUSHERS[loop] = cls()
        return flusher

    @classmethod
    def running(cls) -> asyncio.Task[None] | None:
        """The running loop's flush task, while one runs."""
        flusher = _FLUSHERS.get(asyncio.get_running_loop())
        return None if flusher is None else flusher._task

    def hold(self, emitter: EnvelopeEmitter, delay: float) -> None:
        """``emitter`` holds text that must be flushed within ``delay`` seconds."""
        self._held[emitter] = None
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        if self._timer is None or due < self._due:
            if self._timer is not None:
                self._timer.cancel()
            self._due = due
            self._timer = loop.call_at(due, self._fire)

    def release(self, emitter: EnvelopeEmitter) -> None:
        """``emitter`` flushed its text itself."""
        self._held.pop(emitter, None)
        if not self._held and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        together: list[EnvelopeEmitter] = []
        for emitter in self._held:
            emitter._flusher = None
            if emitter._lock.locked() or not _never_waits(emitter.publisher):
                emitter._flush_alone()
            else:
                together.append(emitter)
        self._held = {}
        if together:
            task = asyncio.get_running_loop().create_task(self._flush(together))
            self._task = task
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        if self._task is task:
            self._task = None

    @staticmethod
    async def _flush(emitters: list[EnvelopeEmitter]) -> None:
        for emitter in emitters:
            # Nothing here pauses (free locks, publishers that only buffer), but an
            # emitter that got busy since the timer fired must not hold up the others.
            if emitter._lock.locked():
                emitter._flush_alone()
            else:
                await emitter._timer_flush()


_FLUSHERS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _SharedFlusher] = (
    weakref.WeakKeyDictionary()
)
"""The shared flusher of each event loop."""


def _never_waits(publisher: Publisher) -> bool:
    """Whether ``publisher.broadcast`` returns without waiting (it buffers)."""
    return bool(getattr(publisher, "never_waits", False))


class AgentEventAdapter(EnvelopeEmitter):
    """Publishes an agent's events as envelopes on ``agent.<session_id>``.

    Args:
        publisher: where envelopes go.
        session_id: the session; the channel is ``channel`` or ``agent.<session_id>``.
        execution_id: the run's id, used for every envelope.
        options: what to publish (see :class:`AdapterOptions`).
        final_state: stores the final state before the final ``agent.status``.
        channel: publish here instead of ``agent.<session_id>`` (e.g. a private one).
        parent: the parent run and tool call of a nested run (see :class:`EnvelopeEmitter`).
    """

    def __init__(
        self,
        publisher: Publisher,
        session_id: str,
        execution_id: str,
        *,
        options: AdapterOptions | None = None,
        final_state: FinalStateHook | None = None,
        channel: str | None = None,
        parent: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(
            publisher, session_id, execution_id, options=options, channel=channel, parent=parent
        )
        self._final_state_hook = final_state
        self._refused: str | None = None  # why the final state was not stored as it was
        self._final: AgentState | None = None
        self._latest: AgentState | None = None
        self._steps: dict[int, list[env.ToolCallRef]] = {}

    def install(self, builder: AgentBuilder) -> AgentBuilder:
        """``builder`` with this adapter listening to its events (and capturing the
        final state for reconcile, and the latest one: see :attr:`latest`)."""
        last = -(2**31)  # after every other hook: the state as the point leaves it
        builder = builder.with_listener(self.on_event)
        for point in (HookPoint.EXECUTION_START, HookPoint.STEP_END):
            builder = builder.with_hook(
                point, self._capture_latest, priority=last, name="broadcast"
            )
        return builder.with_hook(
            HookPoint.EXECUTION_END, self._capture_final, priority=last, name="broadcast"
        )

    @property
    def latest(self) -> AgentState | None:
        """The state as of the run's start or its last completed step (None before the
        run starts): what is known of a run that never reached its end."""
        return self._latest

    def _capture_latest(self, state: AgentState) -> AgentState:
        self._latest = state
        return state

    def _capture_final(self, state: AgentState) -> AgentState:
        self._final = self._latest = state
        return state

    async def _dispatch(self, event: ev.AgentEvent) -> None:
        if isinstance(event, ev.ExecutionStarted):
            await self._emit(env.AgentStatus, event, env.StatusPayload(status="in_progress"))
        elif isinstance(event, ev.StepStarted):
            await self._step_started(event)
        elif isinstance(event, ev.ToolCallStarted):
            await self._call_started(event, event.tool_call_id, event.tool_name, event.args)
        elif isinstance(event, ev.ToolCallCompleted):
            await self._call_completed(event)
        elif isinstance(event, ev.ToolCallBlocked):
            await self._tool_blocked(event)
        elif isinstance(event, ev.ContinuationEvaluated):
            await self._continuation(event, event.step_number, event.outcome)
        elif isinstance(event, ev.StepCompleted):
            await self._step_completed(event)
        elif isinstance(event, ev.ExecutionCompleted | ev.ExecutionFailed):
            await self._finished(event)

    async def _step_started(self, event: ev.StepStarted) -> None:
        self._steps[event.step_number] = []
        payload = env.StepStartedPayload(
            step_number=event.step_number,
            message_count=event.message_count,
            available_tools=list(event.available_tools),
        )
        await self._emit(env.StepStarted, event, payload)

    async def _call_started(
        self, event: ev.ToolCallStarted | ev.ToolCallBlocked, call_id: str, name: str, args: Any
    ) -> None:
        calls = self._steps.setdefault(event.step_number, [])
        calls.append(env.ToolCallRef(id=call_id, name=name))
        await self._tool_started(event, call_id, name, args)

    async def _tool_blocked(self, event: ev.ToolCallBlocked) -> None:
        """A blocked call is reported as started and then completed unsuccessfully, so
        a UI shows every call the model asked for."""
        await self._call_started(event, event.tool_call_id, event.tool_name, event.args)
        await self._tool_completed(
            event,
            event.tool_call_id,
            event.tool_name,
            success=False,
            error=f"blocked: {event.reason}",
            duration_ms=0.0,
            result=None,
        )

    async def _step_completed(self, event: ev.StepCompleted) -> None:
        payload = env.StepCompletedPayload(
            step_number=event.step_number,
            has_tool_calls=event.has_tool_calls,
            errors=event.errors,
            finish_reason=None if event.finish_reason is None else event.finish_reason.value,
            usage=usage_payload(event.usage),
            duration_ms=max(event.duration_ms, 0.0),
            tool_calls=self._steps.pop(event.step_number, []),
            continuation=self._summary(event.outcome),
        )
        await self._emit(env.StepCompleted, event, payload)

    async def _finished(self, event: ev.ExecutionCompleted | ev.ExecutionFailed) -> None:
        state_url = await self._store_final()
        failed = isinstance(event, ev.ExecutionFailed) or self._refused is not None
        error = event.error_message if isinstance(event, ev.ExecutionFailed) else None
        stop_reason = None if event.stop_reason is None else event.stop_reason.value
        if self._refused is not None:
            error, stop_reason = self._refused, "error"
        payload = env.StatusPayload(
            status="failed" if failed else "completed",
            step_count=event.step_count,
            error_message=error,
            last_response=None if failed else _last_response(event),
            stop_reason=stop_reason,
            usage=usage_payload(event.usage),
            state_url=state_url,
        )
        self.finished = True
        await self._emit(env.AgentStatus, event, payload)

    async def _store_final(self) -> str | None:
        if self._final_state_hook is None or self._final is None:
            return None
        try:
            return await self._final_state_hook(self._final)
        except FinalStateRefused as exc:
            self.failures += 1
            self._refused = str(exc)
            return exc.state_url
        except Exception:
            self.failures += 1
            logger.exception("could not store the final state of session %s", self.session_id)
            return None


def _step(event: ev.AgentEvent) -> int | None:
    number = getattr(event, "step_number", None)
    return number if isinstance(number, int) and number >= 1 else None


def usage_payload(usage: Usage) -> env.UsagePayload:
    return env.UsagePayload(prompt=usage.prompt, completion=usage.completion, total=usage.total)


def _last_response(event: ev.ExecutionCompleted | ev.ExecutionFailed) -> str | None:
    if isinstance(event, ev.ExecutionCompleted):
        return _clip(event.final_response, 2000) or None
    return None
