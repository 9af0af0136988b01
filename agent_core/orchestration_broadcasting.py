"""Orchestrator events as envelopes: tool use, chat, collaboration and capability
routing on the same ``agent.<session>`` envelope types as the agent, so one dashboard
watches any of them.

=====================================  ==================================================
event                                  envelope
=====================================  ==================================================
ProcessStarted                         ``agent.status`` (``in_progress``)
ProcessStepStarted                     ``agent.step.started`` (``actor``: participant,
                                       collaborator or capability)
ToolCallStarted / ToolCallCompleted    ``agent.tool.started`` / ``agent.tool.completed``
                                       (tools of ToolUse and model actors; a capability
                                       execution, with its own call id)
ReferencesResolved, IntentClassified   a ``agent.tool.started`` + ``agent.tool.completed``
                                       pair named ``reference_resolver`` /
                                       ``intent_classifier`` (routing stages)
StreamChunk                            ``agent.stream.chunk`` (coalesced)
ProcessContinuationEvaluated           ``agent.continuation`` (trace option; routing:
                                       the decider's ContinuationResult is one of the
                                       evaluations)
ProcessStepCompleted / ...StepFailed   ``agent.step.completed`` (errors counted,
                                       continuation summary)
ProcessCompleted                       ``agent.status`` (``completed`` / ``failed``,
                                       ``stop_reason``, usage, last response)
ActorSelected, ProcessStateUpdated,    none (the actor travels in the step envelope)
SessionMemoryAppended
=====================================  ==================================================

Options are the agent adapter's :class:`~agent_core.broadcasting.AdapterOptions`.
Envelopes are published one at a time, in event order, under one lock; streamed
text is held until ``coalesce_deltas`` deltas, the end of the stream, or the next
other event.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from agent_core import events as ev
from agent_core import orchestration_events as oe
from agent_core.broadcasting import AdapterOptions, summarize_args, summarize_result
from agent_core.continuation import ContinuationOutcome
from agent_core.messages import Usage
from agent_core.state import AgentStatus
from agent_core.stepbystep import StepByStep
from broadcaster import envelope as env
from broadcaster.publishers import Publisher

__all__ = ["OrchestrationEventAdapter"]

logger = logging.getLogger(__name__)


class OrchestrationEventAdapter:
    """Publishes an orchestrator's events as envelopes on ``agent.<session_id>``.

    Args:
        publisher: where envelopes go.
        session_id: the session; the channel is ``channel`` or ``agent.<session_id>``.
        execution_id: used for events that carry no execution id.
        options: what to publish (see :class:`~agent_core.broadcasting.AdapterOptions`).
        channel: publish here instead of ``agent.<session_id>``.
    """

    def __init__(
        self,
        publisher: Publisher,
        session_id: str,
        execution_id: str | None = None,
        *,
        options: AdapterOptions | None = None,
        channel: str | None = None,
    ) -> None:
        self.publisher = publisher
        self.session_id = session_id
        self.execution_id = execution_id
        self.options = options or AdapterOptions()
        self.channel = channel or env.channel_for(session_id)
        self.failures = 0
        self._lock = asyncio.Lock()
        self._chunks: list[str] = []
        self._chunk_step: int | None = None
        self._chunk_index = 0
        self._last_event: ev.AgentEvent | None = None

    def install(self, orchestrator: StepByStep[Any, Any]) -> None:
        """Listen to ``orchestrator``'s events."""
        orchestrator.listen(self.on_event)

    async def aclose(self) -> None:
        """Publish held text."""
        async with self._lock:
            await self._flush_chunks(complete=False)

    # -- events ---------------------------------------------------------------------------

    async def on_event(self, event: ev.AgentEvent) -> None:
        """The listener: map one event to zero or more envelopes."""
        async with self._lock:
            self._last_event = event
            if isinstance(event, ev.StreamChunk):
                await self._on_chunk(event)
                return
            await self._flush_chunks(complete=False)
            await self._dispatch(event)

    async def _dispatch(self, event: ev.AgentEvent) -> None:
        if isinstance(event, oe.ProcessStarted):
            await self._emit(env.AgentStatus, event, env.StatusPayload(status="in_progress"))
        elif isinstance(event, oe.ProcessStepStarted):
            await self._step_started(event)
        elif isinstance(event, ev.ToolCallStarted):
            await self._tool_started(event, event.tool_call_id, event.tool_name, event.args)
        elif isinstance(event, ev.ToolCallCompleted):
            await self._tool_completed(
                event,
                event.tool_call_id,
                event.tool_name,
                event.success,
                event.error,
                event.duration_ms,
                event.result,
            )
        elif isinstance(event, oe.ReferencesResolved):
            await self._stage(
                event,
                event.call_id,
                "reference_resolver",
                {"input": event.original},
                event.duration_ms,
                event.resolved,
            )
        elif isinstance(event, oe.IntentClassified):
            result = f"{event.capability}({summarize_args(event.arguments)})"
            await self._stage(
                event,
                event.call_id,
                "intent_classifier",
                {"message": event.message},
                event.duration_ms,
                result,
            )
        elif isinstance(event, oe.ProcessContinuationEvaluated):
            await self._continuation(event)
        elif isinstance(event, oe.ProcessStepCompleted):
            await self._step_completed(event)
        elif isinstance(event, oe.ProcessCompleted):
            await self._completed(event)

    async def _step_started(self, event: oe.ProcessStepStarted) -> None:
        payload = env.StepStartedPayload(
            step_number=event.step_number,
            message_count=event.message_count,
            available_tools=list(event.available_tools),
            actor=event.actor,
        )
        await self._emit(env.StepStarted, event, payload)

    async def _tool_started(
        self,
        event: ev.AgentEvent,
        call_id: str,
        name: str,
        args: Mapping[str, Any],
        step_number: int | None = None,
    ) -> None:
        payload = env.ToolStartedPayload(
            tool_name=name,
            tool_call_id=call_id,
            args_summary=self._args(args),
            step_number=step_number if step_number is not None else _step(event),
        )
        await self._emit(env.ToolStarted, event, payload)

    async def _tool_completed(
        self,
        event: ev.AgentEvent,
        call_id: str,
        name: str,
        success: bool,
        error: str | None,
        duration_ms: float,
        result: Any,
        step_number: int | None = None,
    ) -> None:
        payload = env.ToolCompletedPayload(
            tool_name=name,
            tool_call_id=call_id,
            success=success,
            error=error,
            duration_ms=max(duration_ms, 0.0),
            result_summary=summarize_result(result, self.options.summary_length),
            step_number=step_number if step_number is not None else _step(event),
        )
        await self._emit(env.ToolCompleted, event, payload)

    async def _stage(
        self,
        event: ev.AgentEvent,
        call_id: str,
        name: str,
        args: Mapping[str, Any],
        duration_ms: float,
        result: str,
    ) -> None:
        """A routing stage before its step began, as a tool-like call without a step."""
        await self._tool_started(event, call_id, name, args)
        await self._tool_completed(event, call_id, name, True, None, duration_ms, result)

    async def _continuation(self, event: oe.ProcessContinuationEvaluated) -> None:
        if not self.options.include_continuation_trace:
            return
        outcome = event.outcome
        payload = env.ContinuationPayload(
            step_number=event.step_number,
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

    async def _step_completed(self, event: oe.ProcessStepCompleted) -> None:
        payload = env.StepCompletedPayload(
            step_number=event.step_number,
            has_tool_calls=bool(event.tool_calls),
            errors=event.errors,
            finish_reason=None if event.finish_reason is None else event.finish_reason.value,
            usage=_usage(event.usage),
            duration_ms=max(event.duration_ms, 0.0),
            tool_calls=[env.ToolCallRef(id=c.id, name=c.name) for c in event.tool_calls],
            continuation=self._summary(event.outcome),
        )
        await self._emit(env.StepCompleted, event, payload)

    def _summary(self, outcome: ContinuationOutcome) -> env.ContinuationSummary | None:
        if not self.options.include_step_continuation:
            return None
        return env.ContinuationSummary(
            should_continue=outcome.should_continue,
            stop_reason=outcome.stop_reason.value,
            resolved_by=outcome.resolved_by,
        )

    async def _completed(self, event: oe.ProcessCompleted) -> None:
        failed = event.status is AgentStatus.FAILED
        response = event.final_response
        payload = env.StatusPayload(
            status="failed" if failed else "completed",
            step_count=event.step_count,
            error_message=event.error_message if failed else None,
            last_response=None if failed or not response else response[:2000],
            stop_reason=event.stop_reason.value,
            usage=_usage(event.usage),
        )
        await self._emit(env.AgentStatus, event, payload)

    # -- streamed text --------------------------------------------------------------------

    async def _on_chunk(self, event: ev.StreamChunk) -> None:
        if not self.options.include_stream_chunks:
            return
        if self._chunk_step not in (None, event.step_number):
            await self._flush_chunks(complete=False)
        self._chunk_step = event.step_number
        if event.text_delta:
            self._chunks.append(event.text_delta)
        if event.is_complete or len(self._chunks) >= self.options.coalesce_deltas:
            await self._flush_chunks(complete=event.is_complete)

    async def _flush_chunks(self, *, complete: bool) -> None:
        """Publish held text (caller holds the lock)."""
        if not self._chunks and not complete:
            return
        text, deltas = "".join(self._chunks), len(self._chunks)
        self._chunks = []
        payload = env.StreamChunkPayload(
            chunk=text,
            is_complete=complete,
            tokens_delta=deltas,
            chunk_index=self._chunk_index,
            step_number=self._chunk_step or None,
        )
        self._chunk_index += 1
        if complete:
            self._chunk_step = None
        await self._publish(env.StreamChunk(**self._ids(self._last_event), payload=payload))

    # -- publishing -----------------------------------------------------------------------

    def _args(self, args: Mapping[str, Any]) -> str:
        o = self.options
        return summarize_args(
            args,
            max_args=o.max_summary_args,
            value_length=o.arg_value_length,
            redact=o.redact_tool_args,
        )

    def _ids(self, event: ev.AgentEvent | None) -> dict[str, str]:
        execution = (None if event is None else event.execution_id) or self.execution_id
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
        try:
            await self.publisher.broadcast(self.channel, envelope)
        except Exception:
            # The run must not die because its audience cannot be reached.
            self.failures += 1
            logger.exception("could not publish %s for session %s", envelope.type, self.session_id)


def _step(event: ev.AgentEvent) -> int | None:
    number = getattr(event, "step_number", None)
    return number if isinstance(number, int) and number >= 1 else None


def _usage(usage: Usage) -> env.UsagePayload:
    return env.UsagePayload(prompt=usage.prompt, completion=usage.completion, total=usage.total)
