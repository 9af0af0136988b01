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
                                       ``intent_classifier`` (routing stages, with the
                                       step number of the step they prepare; the
                                       classifier's result reads ``<capability> ·
                                       confidence <c> · <reason>``)
ContinuationDecided                    a pair named ``continuation_decider`` inside the
                                       step (arguments: capability, success,
                                       duration_ms, session_id; result: ``done``
                                       [``· final output: …``] or ``continue →
                                       <capability>(<args>)``; ``success`` false
                                       with the decider's error)
StreamChunk                            ``agent.stream.chunk`` (coalesced)
ProcessContinuationEvaluated           ``agent.continuation`` (trace option; routing:
                                       the decider's ContinuationResult is one of the
                                       evaluations)
ProcessStepCompleted / ...StepFailed   ``agent.step.completed`` (errors counted,
                                       continuation summary)
SessionMemoryAppended                  a pair named ``session_memory`` after the last
                                       step (arguments: session_id, capability,
                                       success; result: ``turn remembered · <n> kept``)
ProcessCompleted                       ``agent.status`` (``completed`` / ``failed``,
                                       ``stop_reason``, usage, last response)
ActorSelected, ProcessStateUpdated     none (the actor travels in the step envelope)
=====================================  ==================================================

With ``defer_final=True`` the final ``agent.status`` waits for
:meth:`OrchestrationEventAdapter.publish_final`, so that a run manager can store the
final state first and name its URL (``state_url``), as the agent adapter does.

Options are the agent adapter's :class:`~agent_core.adapters.broadcasting.AdapterOptions`; the
publishing machinery (order, coalesced text, ids) is the agent adapter's too
(:class:`~agent_core.adapters.broadcasting.EnvelopeEmitter`).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from agent_core import events as ev
from agent_core.adapters.broadcasting import (
    AdapterOptions,
    AgentEventAdapter,
    EnvelopeEmitter,
    summarize_args,
    usage_payload,
)
from agent_core.orchestrators import orchestration_events as oe
from agent_core.orchestrators.routing.capabilities import CAPABILITY_CALL
from agent_core.orchestrators.routing.decider import ContinuationResult
from agent_core.orchestrators.stepbystep import StepByStep
from agent_core.state import AgentStatus
from broadcaster import envelope as env
from broadcaster.publishers import Publisher

__all__ = ["OrchestrationEventAdapter", "nested_run_adapter", "publishing_nested_runs"]

_NESTING: ContextVar[OrchestrationEventAdapter | None] = ContextVar("nesting", default=None)


@contextmanager
def publishing_nested_runs(adapter: OrchestrationEventAdapter) -> Iterator[None]:
    """Within the block, a capability that runs an agent publishes it as a run nested
    under its call, on ``adapter``'s channel (:func:`nested_run_adapter`)."""
    token = _NESTING.set(adapter)
    try:
        yield
    finally:
        _NESTING.reset(token)


def nested_run_adapter() -> AgentEventAdapter | None:
    """The adapter of an agent a capability runs now, as a nested run: on the routed
    run's channel, with an execution id of its own, every payload naming the routed run
    and the capability call (``parent_execution_id``, ``parent_tool_call_id``). None
    outside :func:`publishing_nested_runs` or a capability call."""
    parent, call = _NESTING.get(), CAPABILITY_CALL.get()
    if parent is None or call is None or parent.execution_id is None:
        return None
    return AgentEventAdapter(
        parent.publisher,
        parent.session_id,
        f"x-{secrets.token_hex(8)}",
        options=parent.options,
        channel=parent.channel,
        parent=(parent.execution_id, call),
    )


class OrchestrationEventAdapter(EnvelopeEmitter):
    """Publishes an orchestrator's events as envelopes on ``agent.<session_id>``.

    Args:
        publisher: where envelopes go.
        session_id: the session; the channel is ``channel`` or ``agent.<session_id>``.
        execution_id: used for every envelope; when None, each event's own.
        options: what to publish (see :class:`~agent_core.adapters.broadcasting.AdapterOptions`).
        channel: publish here instead of ``agent.<session_id>``.
        defer_final: hold the final ``agent.status`` until :meth:`publish_final`.
    """

    def __init__(
        self,
        publisher: Publisher,
        session_id: str,
        execution_id: str | None = None,
        *,
        options: AdapterOptions | None = None,
        channel: str | None = None,
        defer_final: bool = False,
    ) -> None:
        super().__init__(publisher, session_id, execution_id, options=options, channel=channel)
        self.defer_final = defer_final
        self._final: tuple[oe.ProcessCompleted, env.StatusPayload] | None = None

    async def publish_final(self, state_url: str | None = None, failure: str | None = None) -> bool:
        """Publish the held final ``agent.status`` (with ``state_url``; ``failed`` with
        ``failure`` as its message when given: its final state could not be stored as it
        was); False if the execution has not ended (nothing held)."""
        async with self._lock:
            if self._final is None:
                return False
            event, payload = self._final
            self._final = None
            self.finished = True
            update: dict[str, Any] = {"state_url": state_url}
            if failure is not None:
                update |= {"status": "failed", "error_message": failure, "stop_reason": "error"}
            await self._emit(env.AgentStatus, event, payload.model_copy(update=update))
            return True

    def install(self, orchestrator: StepByStep[Any, Any]) -> None:
        """Listen to ``orchestrator``'s events."""
        orchestrator.listen(self.on_event)

    async def _dispatch(self, event: ev.AgentEvent) -> None:
        if isinstance(event, oe.ProcessStarted):
            await self._emit(env.AgentStatus, event, env.StatusPayload(status="in_progress"))
        elif isinstance(event, oe.ProcessStepStarted):
            await self._step_started(event)
        elif isinstance(event, ev.ToolCallStarted):
            await self._tool_started(event, event.tool_call_id, event.tool_name, event.args)
        elif isinstance(event, ev.ToolCallCompleted):
            await self._call_completed(event)
        elif isinstance(event, oe.ReferencesResolved):
            args = {"input": event.original}
            await self._stage(event, event.call_id, "reference_resolver", args, event.resolved)
        elif isinstance(event, oe.IntentClassified):
            args = {"message": event.message}
            await self._stage(event, event.call_id, "intent_classifier", args, _intent(event))
        elif isinstance(event, oe.ContinuationDecided):
            await self._decided(event)
        elif isinstance(event, oe.SessionMemoryAppended):
            await self._remembered(event)
        elif isinstance(event, oe.ProcessContinuationEvaluated):
            await self._continuation(event, event.step_number, event.outcome)
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

    async def _stage(
        self,
        event: oe.ReferencesResolved | oe.IntentClassified,
        call_id: str,
        name: str,
        args: Mapping[str, Any],
        result: str,
    ) -> None:
        """A routing stage before its step began, as a tool-like call without a step."""
        await self._tool_started(event, call_id, name, args)
        await self._tool_completed(
            event,
            call_id,
            name,
            success=True,
            error=None,
            duration_ms=event.duration_ms,
            result=result,
        )

    async def _decided(self, event: oe.ContinuationDecided) -> None:
        """The decider's verdict as a tool-like call inside the step."""
        args = {
            "capability": event.capability,
            "success": event.success,
            "duration_ms": round(event.duration_ms, 3),
            "session_id": self.session_id,
        }
        await self._tool_started(event, event.call_id, "continuation_decider", args)
        await self._tool_completed(
            event,
            event.call_id,
            "continuation_decider",
            success=event.error is None,
            error=event.error,
            duration_ms=event.duration_ms,
            result=None if event.decision is None else _verdict(event.decision),
        )

    async def _remembered(self, event: oe.SessionMemoryAppended) -> None:
        """The turn kept in session memory, as a tool-like call after the last step."""
        args = {
            "session_id": event.session_id,
            "capability": event.capability,
            "success": event.success,
        }
        call_id = event.call_id or f"remember_{event.execution_id}"
        await self._tool_started(event, call_id, "session_memory", args)
        await self._tool_completed(
            event,
            call_id,
            "session_memory",
            success=True,
            error=None,
            duration_ms=event.duration_ms,
            result=f"turn remembered · {event.turns} kept",
        )

    async def _step_completed(self, event: oe.ProcessStepCompleted) -> None:
        payload = env.StepCompletedPayload(
            step_number=event.step_number,
            has_tool_calls=bool(event.tool_calls),
            errors=event.errors,
            finish_reason=None if event.finish_reason is None else event.finish_reason.value,
            usage=usage_payload(event.usage),
            duration_ms=max(event.duration_ms, 0.0),
            tool_calls=[env.ToolCallRef(id=c.id, name=c.name) for c in event.tool_calls],
            continuation=self._summary(event.outcome),
        )
        await self._emit(env.StepCompleted, event, payload)

    async def _completed(self, event: oe.ProcessCompleted) -> None:
        failed = event.status is AgentStatus.FAILED
        response = event.final_response
        payload = env.StatusPayload(
            status="failed" if failed else "completed",
            step_count=event.step_count,
            error_message=event.error_message if failed else None,
            last_response=None if failed or not response else response[:2000],
            stop_reason=event.stop_reason.value,
            usage=usage_payload(event.usage),
        )
        if self.defer_final:
            self._final = (event, payload)
            return
        self.finished = True
        await self._emit(env.AgentStatus, event, payload)


def _verdict(decision: ContinuationResult) -> str:
    """``done`` (``· final output: ...``) or ``continue → <capability>(<arguments>)``."""
    if not decision.done:
        return f"continue → {decision.next_capability}({summarize_args(decision.arguments)})"
    return "done" if not decision.final_output else f"done · final output: {decision.final_output}"


def _intent(event: oe.IntentClassified) -> str:
    """``<capability> · confidence <c> · <reason>`` (the parts that are known)."""
    parts = [event.capability]
    if event.confidence is not None:
        parts.append(f"confidence {event.confidence:.2f}")
    if event.reason:
        parts.append(event.reason)
    return " · ".join(parts)
