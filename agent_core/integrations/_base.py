"""What every framework adapter shares: :class:`FrameworkRun`, an emitter driven by
explicit calls (run started, step started, text, tool started/completed, step
completed, run ended) instead of ``agent_core`` events.

It is an :class:`~agent_core.adapters.broadcasting.EnvelopeEmitter`, so its envelopes are built,
ordered, coalesced and published exactly like :class:`AgentEventAdapter`'s: one lock,
streamed text held and flushed before the next envelope, the same tool summaries. It
also records what it publishes, so that at the end it stores a slim final snapshot
(``StateStore``; by default the publisher itself, which stores it on the server) and
names its URL in the final ``agent.status``, as a run of ``agent_core`` does.

It keeps ``agent_core``'s rule (docs/agent_core.md): a run is ``failed`` exactly when
its stop reason is ``error``, and the final status, the last step's continuation and
the snapshot say the same. So a step's ``agent.step.completed`` (and its
``agent.continuation``) is published when the next step starts (the framework went
on) or when the run ends, with the run's own stop: ``completed``, ``error``, or a
framework limit said as ``agent_core``'s (``steps_limit``, status ``completed``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from agent_core.adapters.broadcasting import (
    AdapterOptions,
    EnvelopeEmitter,
    encode_final_state,
    json_text,
    summarize_result,
)
from agent_core.events import AgentEvent, StreamChunk
from agent_core.messages import Usage
from agent_core.slim import OMITTED_TOOL_RESULT, SlimSerializationConfig
from broadcaster import envelope as env
from broadcaster.publishers import Publisher, StateStore, run_recorder

__all__ = ["FrameworkRun", "StepRecord", "default_state_url", "snapshot_config"]

logger = logging.getLogger(__name__)

_FINISH_REASONS = ("stop", "length", "tool_calls", "content_filter", "error")


def snapshot_config() -> SlimSerializationConfig:
    """The slim preset of a framework run's snapshot: the one ``agent_core`` runs store
    (standard, with the last continuation)."""
    return replace(SlimSerializationConfig.standard(), include_continuation_trace=True)


def default_state_url(session_id: str) -> str:
    """The server's reconcile URL of ``session_id`` (``GET /api/sessions/{id}/state``)."""
    return f"/api/sessions/{session_id}/state"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Mark(AgentEvent):
    """The event an envelope is stamped from (its time and step)."""

    step_number: int = 0


@dataclass
class StepRecord:
    """One step as the snapshot tells it."""

    step_number: int
    actor: str | None
    started: float
    tool_calls: list[dict[str, str]]
    errors: int = 0
    usage: Usage = field(default_factory=Usage)
    finish_reason: str | None = None
    duration_ms: float = 0.0
    decision: dict[str, Any] | None = None


class FrameworkRun(EnvelopeEmitter):
    """One framework run published as envelopes on ``agent.<session_id>``.

    Call, in order: :meth:`started`, then per step :meth:`step_started`, :meth:`text`
    / :meth:`tool_started` / :meth:`tool_completed`, :meth:`step_completed`, and at the
    end :meth:`completed`, :meth:`failed` or :meth:`limited`. Calls out of order (a tool
    before any step, a step completed twice) are tolerated: a step is opened when needed,
    an open step is closed at the end and a tool call still running at the end is
    reported failed, so the envelope stream always pairs up.

    Args:
        publisher: where envelopes go.
        session_id: the session; the channel is ``channel`` or ``agent.<session_id>``.
        execution_id: the run's id (default: a new uuid4 hex).
        framework: the framework's name, put in the snapshot's metadata.
        agent_id: the agent's name in the snapshot.
        options: what to publish (see :class:`AdapterOptions`).
        state_store: where the final snapshot is stored (None: the publisher, when it
            is a :class:`~broadcaster.publishers.StateStore` itself, as the Pusher HTTP,
            in-process and Redis publishers are, or the one it wraps, as
            ``TracingPublisher`` does; else it is not stored).
        state_url: the URL put into the final ``agent.status`` when it was stored
            (default: the server's ``/api/sessions/{id}/state``).
        channel: publish here instead of ``agent.<session_id>``.
        slim: the snapshot's limits (default: :func:`snapshot_config`).
        flush_timeout: how long the end of the run waits for a buffered publisher
            (one with ``flush(within)``) to deliver it.
    """

    def __init__(
        self,
        publisher: Publisher,
        session_id: str,
        execution_id: str | None = None,
        *,
        framework: str,
        agent_id: str = "agent",
        options: AdapterOptions | None = None,
        state_store: StateStore | None = None,
        state_url: Callable[[str], str] = default_state_url,
        channel: str | None = None,
        slim: SlimSerializationConfig | None = None,
        flush_timeout: float = 10.0,
    ) -> None:
        super().__init__(
            publisher,
            session_id,
            execution_id or uuid.uuid4().hex,
            options=options,
            channel=channel,
        )
        self.framework = framework
        self.agent_id = agent_id
        self.state_store = state_store if state_store is not None else _own_store(publisher)
        self.state_url = state_url
        self.slim = slim or snapshot_config()
        self.flush_timeout = flush_timeout
        self.step_number = 0
        self.usage = Usage()
        self.started_at: datetime | None = None
        self._step: StepRecord | None = None
        self._held: StepRecord | None = None
        self._steps: list[StepRecord] = []
        self._calls: dict[str, tuple[str, float]] = {}
        self._messages: list[dict[str, Any]] = []
        self._text: list[str] = []
        self._chunk_count = 0
        self._last_decision: dict[str, Any] | None = None
        self._end_reason: str | None = None

    # -- the calls an adapter makes -------------------------------------------------------

    async def started(self, prompt: str | None = None, tools: Sequence[str] = ()) -> None:
        """The run began: ``agent.status`` ``in_progress``."""
        self.started_at = datetime.now(UTC)
        if prompt:
            self._messages.append({"role": "user", "content": prompt, "metadata": {}})
        runs = run_recorder(self.state_store)
        if runs is not None and self.execution_id:
            await runs.started(self.channel, self.execution_id, input_text=prompt or "")
        await self._send(env.AgentStatus, env.StatusPayload(status="in_progress"))

    async def step_started(
        self, *, actor: str | None = None, tools: Sequence[str] = (), message_count: int = 0
    ) -> int:
        """A step began (closing the one still open); returns its number."""
        if self._step is not None:
            await self.step_completed()
        await self._release(_GO_ON)
        self.step_number += 1
        self._step = StepRecord(self.step_number, actor, time.monotonic(), [])
        payload = env.StepStartedPayload(
            step_number=self.step_number,
            message_count=message_count,
            available_tools=list(tools),
            actor=actor,
        )
        await self._send(env.StepStarted, payload)
        return self.step_number

    async def text(self, delta: str) -> None:
        """Streamed text of the current step (coalesced like the engine's)."""
        if not delta:
            return
        await self._ensure_step()
        self._text.append(delta)
        await self.on_event(self._chunk(delta, complete=False))

    async def tool_requested(self, call_id: str, name: str) -> None:
        """The model of the current step asked for tool call ``call_id`` (it runs later,
        see :meth:`tool_started`): the step carries it from now on."""
        step = await self._ensure_step()
        if all(call["id"] != call_id for call in step.tool_calls):
            step.tool_calls.append({"id": call_id, "name": name})

    async def tool_started(self, call_id: str, name: str, args: Mapping[str, Any]) -> None:
        """The model's tool call ``call_id`` is about to run with ``args``."""
        step = await self._ensure_step()
        if all(call["id"] != call_id for call in step.tool_calls):
            step.tool_calls.append({"id": call_id, "name": name})
        self._calls[call_id] = (name, time.monotonic())
        self._tool_message(call_id, name, args)
        mark = self._mark()
        async with self._lock:
            await self._end_stream()  # the model's text ended before it asked for a tool
            await self._tool_started(mark, call_id, name, args)

    async def tool_completed(
        self, call_id: str, result: Any = None, *, error: str | None = None, name: str = ""
    ) -> None:
        """Tool call ``call_id`` ended with ``result`` (or failed with ``error``)."""
        known, began = self._calls.pop(call_id, (name or "tool", time.monotonic()))
        step = await self._ensure_step()
        step.errors += error is not None
        content = summarize_result(result, 500) if error is None else f"error: {error}"
        self._messages.append(
            {
                "role": "tool",
                "content": content or "",
                "metadata": {"tool_call_id": call_id, "tool_name": known},
            }
        )
        mark = self._mark()
        async with self._lock:
            await self._flush_chunks(complete=False)
            await self._tool_completed(
                mark,
                call_id,
                known,
                success=error is None,
                error=error,
                duration_ms=(time.monotonic() - began) * 1000,
                result=result,
            )

    async def step_completed(
        self, *, input_tokens: int = 0, output_tokens: int = 0, finish_reason: str | None = None
    ) -> None:
        """The current step ended, having used ``input_tokens``/``output_tokens``.

        Its ``agent.step.completed`` goes out when the next step starts or the run ends:
        only then is it known whether the framework went on.
        """
        step = self._step
        if step is None:
            return
        self._step = None
        # A framework's counts, as it reports them: bounded here (never negative, never
        # past what the wire holds exactly), so the run's end can always be published.
        step.usage = Usage.of(env.wire_int(int(input_tokens)), env.wire_int(int(output_tokens)))
        self.usage = self.usage + step.usage
        step.finish_reason = _finish(finish_reason, bool(step.tool_calls))
        step.duration_ms = (time.monotonic() - step.started) * 1000
        self._steps.append(step)
        await self._close_text()
        self._held = step

    async def _release(self, decision: dict[str, Any]) -> None:
        """Publish the held step's end with ``decision`` (continue, or the run's stop)."""
        step, self._held = self._held, None
        if step is None:
            return
        step.decision = {**decision, "resolved_by": self.framework}
        if self.options.include_continuation_trace:
            await self._send(env.AgentContinuation, _trace(self, step), step.step_number)
        payload = env.StepCompletedPayload(
            step_number=step.step_number,
            has_tool_calls=bool(step.tool_calls),
            errors=step.errors,
            finish_reason=step.finish_reason,
            usage=env.UsagePayload(
                prompt=step.usage.prompt, completion=step.usage.completion, total=step.usage.total
            ),
            duration_ms=step.duration_ms,
            tool_calls=[env.ToolCallRef(**call) for call in step.tool_calls],
            continuation=self._decision(step),
        )
        await self._send(env.StepCompleted, payload, step.step_number)

    async def completed(self, output: Any = None, *, stop_reason: str = "completed") -> None:
        """The run ended with ``output``: the final ``agent.status`` ``completed``."""
        await self._end("completed", output=output, stop_reason=stop_reason)

    async def failed(self, message: str) -> None:
        """The run failed with ``message``: the final ``agent.status`` ``failed``, stop
        reason ``error``."""
        await self._end("failed", error=message, stop_reason="error")

    async def limited(self, message: str, *, stop_reason: str = "steps_limit") -> None:
        """A framework limit ended the run (e.g. the Agents SDK's ``max_turns``), said as
        the matching ``agent_core`` limit: status ``completed``, ``stop_reason``; the
        ``message`` is the last continuation's reason."""
        await self._end("completed", stop_reason=stop_reason, reason=message)

    def snapshot(self, status: str, error: str | None = None) -> dict[str, Any]:
        """The slim snapshot of the run so far (what the state endpoint serves), within
        the limits of :attr:`slim`."""
        config = self.slim
        now = datetime.now(UTC)
        began = self.started_at or now
        last = self._steps[-1].decision if self._steps else self._last_decision
        messages = self._messages[-config.max_messages :] if config.max_messages else []
        steps = self._steps[-config.max_steps :] if config.max_steps else []
        return {
            "agent_id": self.agent_id,
            "parent_agent_id": None,
            "status": status,
            **({"error_message": _clip(error or "", config)} if status == "failed" else {}),
            "step_count": len(self._steps),
            "usage": self.usage.model_dump(mode="json"),
            "execution": {
                "started_at": env.utc_timestamp(began),
                "updated_at": env.utc_timestamp(now),
                "cumulative_seconds": round((now - began).total_seconds(), 3),
            },
            "messages": [_slim_message(m, config) for m in messages],
            "steps": [_step_snapshot(s) for s in steps] if config.include_steps else [],
            "last_continuation": last if config.include_continuation_trace else None,
            "metadata": {"framework": self.framework, "execution_id": self.execution_id},
        }

    # -- internals ------------------------------------------------------------------------

    async def _dispatch(self, event: AgentEvent) -> None:  # pragma: no cover - unused
        raise TypeError("FrameworkRun is driven by its methods, not by agent_core events")

    async def _ensure_step(self) -> StepRecord:
        if self._step is None:
            await self.step_started()
        assert self._step is not None
        return self._step

    def _tool_message(self, call_id: str, name: str, args: Mapping[str, Any]) -> None:
        call = {"id": call_id, "name": name, "arguments": dict(args)}
        if self.options.redact_tool_args:
            call.pop("arguments")
        text = "".join(self._text)
        self._text = []
        if self._messages and self._messages[-1]["role"] == "assistant" and not text:
            self._messages[-1]["metadata"].setdefault("tool_calls", []).append(call)
            return
        self._messages.append(
            {"role": "assistant", "content": text, "metadata": {"tool_calls": [call]}}
        )

    async def _close_text(self) -> None:
        if self._text:
            text, self._text = "".join(self._text), []
            self._messages.append({"role": "assistant", "content": text, "metadata": {}})
        async with self._lock:
            await self._end_stream()

    async def _end_stream(self) -> None:
        """Publish held text as the end of the step's stream (caller holds the lock)."""
        if self._chunk_step is not None or self._chunks:
            await self._flush_chunks(complete=True)

    def _decision(self, step: StepRecord) -> env.ContinuationSummary | None:
        if not self.options.include_step_continuation:
            return None
        return env.ContinuationSummary.model_validate(_decision_dict(self, step))

    async def _end(
        self,
        status: str,
        *,
        output: Any = None,
        error: str | None = None,
        stop_reason: str,
        reason: str | None = None,
    ) -> None:
        if self.finished:
            return
        for call_id in list(self._calls):  # a tool the run ended in never completed
            await self.tool_completed(call_id, error=error or reason or "the run ended first")
        if self._step is not None:
            await self.step_completed(finish_reason="error" if error else None)
        decision = {"should_continue": False, "stop_reason": stop_reason}
        self._last_decision = {**decision, "resolved_by": self.framework}
        self._end_reason = error or reason
        if self._held is None and not self._steps and self.options.include_continuation_trace:
            await self._send(env.AgentContinuation, _stop_trace(self, stop_reason), 0)
        await self._release(decision)
        last = None
        if output is not None:
            last = output if isinstance(output, str) else json_text(output)
            if not self._messages or self._messages[-1].get("content") != last:
                self._messages.append({"role": "assistant", "content": last, "metadata": {}})
        snapshot = self.snapshot(status, error)
        state_url, refused = await self._store(snapshot)
        if refused is not None:  # stored failed, saying why: the status says it too
            status, error, stop_reason = "failed", refused, "error"
        payload = env.StatusPayload(
            status="failed" if status == "failed" else "completed",
            step_count=len(self._steps),
            error_message=error,
            last_response=None if last is None else last[:2000],
            stop_reason=stop_reason,
            usage=env.UsagePayload(
                prompt=self.usage.prompt, completion=self.usage.completion, total=self.usage.total
            ),
            state_url=state_url,
        )
        await self._send(env.AgentStatus, payload)
        self.finished = True
        await self.aclose()
        await self._flush_publisher()
        runs = run_recorder(self.state_store)
        if runs is not None and self.execution_id:  # again, the final status delivered
            await runs.ended(self.channel, self.execution_id, status=status, error=error)
        elif state_url is not None and self.state_store is _own_store(self.publisher):
            # The publisher's own store, which the server indexes the run from when it
            # stores (the HTTP API's PUT state, the backend's store): again, now that the
            # final status is delivered, so that the run's trace and index row end with
            # it (the first store came before it, for its state_url). As of now: a
            # state replaces the stored one only when it is newer (409 otherwise).
            await self._store(_later(self.snapshot(status, error), snapshot))

    async def _flush_publisher(self) -> None:
        """Wait until a buffered publisher delivered the run, final status included, so
        that a run ended by ``asyncio.run`` returning loses nothing."""
        flush = getattr(self.publisher, "flush", None)
        if flush is None:
            return
        if not await flush(self.flush_timeout):
            self.failures += 1
            logger.warning(
                "session %s: the publisher did not deliver the run within %.1f s",
                self.session_id,
                self.flush_timeout,
            )

    async def _store(self, snapshot: dict[str, Any]) -> tuple[str | None, str | None]:
        """Store the final ``snapshot``: where it is (None: not stored), and why the run
        failed when JSON could not carry it and it was stored ``failed`` instead."""
        if self.state_store is None:
            return None, None
        try:
            data, refused = encode_final_state(snapshot)
            await self.state_store.save(self.channel, data)
        except Exception:
            self.failures += 1
            logger.exception("could not store the final state of session %s", self.session_id)
            return None, None
        return self.state_url(self.session_id), refused

    def _mark(self, step_number: int | None = None) -> _Mark:
        number = self.step_number if step_number is None else step_number
        mark = _Mark(
            agent_id=self.agent_id,
            execution_id=self.execution_id,
            occurred_at=datetime.now(UTC),
            step_number=number,
        )
        self._last_event = mark
        return mark

    def _chunk(self, delta: str, *, complete: bool, step_number: int | None = None) -> StreamChunk:
        self._chunk_count += 1
        return StreamChunk(
            agent_id=self.agent_id,
            execution_id=self.execution_id,
            occurred_at=datetime.now(UTC),
            step_number=self.step_number if step_number is None else step_number,
            text_delta=delta,
            chunk_index=self._chunk_count,
            is_complete=complete,
        )

    async def _send(self, model: type[Any], payload: Any, step_number: int | None = None) -> None:
        mark = self._mark(step_number)
        async with self._lock:
            await self._flush_chunks(complete=False)
            await self._emit(model, mark, payload)


def _finish(reason: str | None, has_tool_calls: bool) -> str:
    if reason in _FINISH_REASONS:
        return reason
    return "tool_calls" if has_tool_calls else "stop"


def _later(snapshot: dict[str, Any], than: dict[str, Any]) -> dict[str, Any]:
    """``snapshot`` with an ``execution.updated_at`` after ``than``'s (both written by
    :meth:`FrameworkRun.snapshot`, in milliseconds): taken within the same millisecond,
    it is moved one on."""
    now, before = snapshot["execution"]["updated_at"], than["execution"]["updated_at"]
    if now > before:
        return snapshot
    moment = datetime.fromisoformat(before.replace("Z", "+00:00")) + timedelta(milliseconds=1)
    return {
        **snapshot,
        "execution": {**snapshot["execution"], "updated_at": env.utc_timestamp(moment)},
    }


def _own_store(publisher: object) -> StateStore | None:
    """The publisher as a state store, or the one it wraps (``TracingPublisher``)."""
    for _ in range(8):  # wrappers of wrappers, not a cycle
        if isinstance(publisher, StateStore):
            return publisher
        publisher = getattr(publisher, "publisher", None)
        if publisher is None:
            return None
    return None


_Said = Literal["forbid", "allow", "stop"]
_GO_ON: dict[str, Any] = {"should_continue": True, "stop_reason": None}


def _decision_dict(run: FrameworkRun, step: StepRecord) -> dict[str, Any]:
    """What the framework decided after ``step``, in the engine's words."""
    assert step.decision is not None, "decided when released"
    return dict(step.decision)


def _why(run: FrameworkRun, stop_reason: str | None) -> tuple[_Said, str]:
    """The evaluation's decision and reason for a step that ended a run that way."""
    if stop_reason is None:
        return "allow", "the framework went on to another step"
    if stop_reason == "completed":
        return "stop", "the framework ended the run with its answer"
    return "forbid", run._end_reason or stop_reason


def _trace(run: FrameworkRun, step: StepRecord) -> env.ContinuationPayload:
    decision = _decision_dict(run, step)
    return _continuation(
        run, step.step_number, decision["should_continue"], decision["stop_reason"]
    )


def _stop_trace(run: FrameworkRun, stop_reason: str) -> env.ContinuationPayload:
    """The continuation of a run that stopped before its first step (step 0)."""
    return _continuation(run, 0, False, stop_reason)


def _continuation(
    run: FrameworkRun, step_number: int, should_continue: bool, stop_reason: str | None
) -> env.ContinuationPayload:
    """The framework's decision after ``step_number``, as the one evaluation that
    resolved it."""
    said, reason = _why(run, stop_reason)
    return env.ContinuationPayload(
        step_number=step_number,
        should_continue=should_continue,
        stop_reason=stop_reason,
        resolved_by=run.framework,
        evaluations=[
            env.ContinuationEvaluationPayload(
                criterion=run.framework,
                decision=said,
                reason=reason,
                stop_reason=stop_reason,
            )
        ],
    )


def _step_type(step: StepRecord) -> str:
    """Seed 004's step types, as ``agent_core``'s ``AgentStep.step_type``."""
    if step.errors:
        return "error"
    return "tool_execution" if step.tool_calls else "final"


def _step_snapshot(step: StepRecord) -> dict[str, Any]:
    return {
        "step_number": step.step_number,
        "type": _step_type(step),
        "actor": step.actor,
        "has_tool_calls": bool(step.tool_calls),
        "finish_reason": step.finish_reason,
        "errors": step.errors,
        "usage": {"total": step.usage.total},
        "duration_ms": round(step.duration_ms, 1),
        "tool_calls": list(step.tool_calls),
    }


def _clip(text: str, config: SlimSerializationConfig) -> str:
    limit = config.max_content_length
    return text if len(text) <= limit else text[:limit] + "..."


def _slim_message(message: dict[str, Any], config: SlimSerializationConfig) -> dict[str, Any]:
    """``message`` within the slim limits (as :class:`SlimAgentStateSerializer` does)."""
    metadata = dict(message["metadata"])
    if "tool_calls" in metadata:
        metadata["tool_calls"] = [_slim_call(c, config) for c in metadata["tool_calls"]]
    content = _clip(str(message["content"]), config)
    if message["role"] == "tool" and not config.include_tool_results:
        content = OMITTED_TOOL_RESULT
    return {"role": message["role"], "content": content, "metadata": metadata}


def _slim_call(call: dict[str, Any], config: SlimSerializationConfig) -> dict[str, Any]:
    if config.redact_tool_args or "arguments" not in call:
        return {"id": call["id"], "name": call["name"]}
    text = json_text(call["arguments"])
    if len(text) > config.max_content_length:
        return {"id": call["id"], "name": call["name"], "arguments_clipped": _clip(text, config)}
    return dict(call)
