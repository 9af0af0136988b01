"""Capability routing on the step-by-step base (docs/agent_core.md).

:meth:`CapabilityRouter.handle` serves one request (``POST /run {input,
session_id?}``):

1. load the session context (if a session id is given);
2. optionally resolve references in the input against it;
3. classify the intent -> capability and arguments;
4. execute the capability (a tool-like call with its own id, in the step's
   ``tool_calls``) -> ``CapabilityResult``. A capability that raises gives a result
   with ``success: false`` and the error in its metadata; a failed result (raised or
   reported) is also a tool error of the step, judged by the error policy (by default
   the request ends ``failed``, stop reason ``error``);
5. add the step's timing and the session id to the result's metadata and ask the
   continuation decider -> ``ContinuationResult`` (failed results too: the decider sees
   the whole result); while it is not done, run the capability it names (the routing
   loop), bounded by ``max_steps``. A decider that fails does not lose the result: its
   error is recorded on the step and the request is done with the capability's output;
6. append the turn to session memory (an event, on the wire a ``session_memory`` pair);
7. return the final state (:meth:`RoutingState.result` is the final
   ``CapabilityResult``, with timing and session id in its metadata).

Steps 2-5 are steps of the base: each capability execution is one recorded step whose
outcome includes the decider's evaluation
(:class:`~agent_core.orchestrators.routing.decider.DeciderCriterion`), so every stage
is an event (see :mod:`agent_core.orchestrators.orchestration_events`) and reaches the
session's channel through :mod:`agent_core.adapters.orchestration_broadcasting`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from agent_core._ids import new_id
from agent_core._time import Clock, elapsed_ms, to_iso, utc_now
from agent_core.continuation import ContinuationCriteria
from agent_core.criteria import StepsLimit
from agent_core.error_policy import ErrorPolicy, ErrorPolicyCriterion
from agent_core.errors import AgentError, ToolError
from agent_core.events import EventDispatcher
from agent_core.messages import FinishReason, Message, Role, ToolCall, Usage
from agent_core.orchestrators.orchestration_events import (
    CapabilitySelected,
    ContinuationDecided,
    IntentClassified,
    ReferencesResolved,
    SessionMemoryAppended,
)
from agent_core.orchestrators.process import ProcessState
from agent_core.orchestrators.routing.capabilities import (
    CAPABILITY_CALL,
    Capability,
    CapabilityRegistry,
    CapabilityResult,
)
from agent_core.orchestrators.routing.classifier import (
    Intent,
    IntentClassifier,
    Rule,
    RuleBasedClassifier,
)
from agent_core.orchestrators.routing.decider import (
    ContinuationDecider,
    ContinuationResult,
    DeciderCriterion,
    NoOpContinuationDecider,
)
from agent_core.orchestrators.routing.memory import (
    InMemorySessionMemory,
    ReferenceResolver,
    SessionContext,
    SessionMemory,
    SessionTurn,
)
from agent_core.orchestrators.stepbystep import ProcessorLike, StepByStep, StepContext
from agent_core.steps import StepError

__all__ = [
    "ROUTING_MAX_STEPS",
    "CapabilityRouter",
    "RoutingState",
    "RoutingStep",
    "default_classifier",
]

logger = logging.getLogger(__name__)

ROUTING_MAX_STEPS = 5
"""Capability executions one request may take (the routing loop's bound)."""


@dataclass(frozen=True, slots=True)
class RoutingStep:
    """One capability execution and the decider's answer to it (``decider_error``:
    why the decider gave none)."""

    id: str
    capability: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    call_id: str | None = None
    result: CapabilityResult | None = None
    decision: ContinuationResult | None = None
    decider_error: str | None = None
    errors: tuple[StepError, ...] = ()
    usage: Usage = field(default_factory=Usage)
    messages: tuple[Message, ...] = ()

    @property
    def content(self) -> str:
        return "" if self.result is None else self.result.output

    @property
    def finish_reason(self) -> FinishReason | None:
        return FinishReason.ERROR if self.errors else None

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The capability execution as a tool call (none if it never ran)."""
        if self.call_id is None:
            return ()
        return (ToolCall(id=self.call_id, name=self.capability, arguments=dict(self.arguments)),)

    def has_tool_calls(self) -> bool:
        return self.call_id is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "capability": self.capability,
            "arguments": dict(self.arguments),
            "call_id": self.call_id,
            "result": None if self.result is None else self.result.model_dump(mode="json"),
            "decision": None if self.decision is None else self.decision.model_dump(mode="json"),
            "decider_error": self.decider_error,
            "errors": [e.to_dict() for e in self.errors],
            "usage": self.usage.model_dump(mode="json"),
            "messages": [m.model_dump(mode="json") for m in self.messages],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RoutingStep:
        result, decision = data.get("result"), data.get("decision")
        return cls(
            id=str(data["id"]),
            capability=str(data["capability"]),
            arguments=dict(data.get("arguments") or {}),
            call_id=data.get("call_id"),
            result=None if result is None else CapabilityResult.model_validate(result),
            decision=None if decision is None else ContinuationResult.model_validate(decision),
            decider_error=data.get("decider_error"),
            errors=tuple(StepError.from_dict(e) for e in data.get("errors", ())),
            usage=Usage.model_validate(data.get("usage") or {}),
            messages=tuple(Message.model_validate(m) for m in data.get("messages", ())),
        )


@dataclass(frozen=True, slots=True)
class RoutingState(ProcessState[RoutingStep]):
    """The state of one routed request.

    Attributes:
        session_id: the session, if any.
        input: the user's request as given.
        resolved_input: the request after reference resolution (if it ran).
        intent: the classification.
        context: the session context the request was served with.
    """

    kind = "routing"

    session_id: str | None = None
    input: str = ""
    resolved_input: str | None = None
    intent: Intent | None = None
    context: SessionContext | None = None

    @classmethod
    def decode_step(cls, data: Mapping[str, Any]) -> RoutingStep:
        return RoutingStep.from_dict(data)

    def request_text(self) -> str:
        """The request the capabilities serve (resolved if it was)."""
        return self.resolved_input or self.input

    def final_response(self) -> str:
        """The decider's final output if it gave one, else the last capability
        output."""
        for result in reversed(self.results):
            decision, outcome = result.step.decision, result.step.result
            if decision is not None and decision.final_output:
                return decision.final_output
            if outcome is not None:
                return outcome.output
        return ""

    def result(self) -> CapabilityResult | None:
        """The request's answer as a capability result (``None`` if nothing ran):
        metadata holds the session id, the steps, the capabilities, the start, end and
        duration, and the last step's error if it failed (then ``success`` is false)."""
        executed = [r for r in self.execution_results() if r.step.result is not None]
        if not self.execution_results():
            return None
        last = self.execution_results()[-1]
        ok = not last.step.errors and (last.step.result is None or last.step.result.success)
        first = self.execution_results()[0]
        metadata: dict[str, Any] = {
            "session_id": self.session_id,
            "steps": len(self.execution_results()),
            "capabilities": [r.step.capability for r in executed],
            "started_at": to_iso(first.started_at),
            "completed_at": to_iso(last.completed_at),
            "duration_ms": round(elapsed_ms(first.started_at, last.completed_at), 3),
        }
        if last.step.errors:
            metadata["error"] = last.step.errors[0].message
        return CapabilityResult(
            capability=last.step.capability,
            output=self.final_response(),
            success=ok and bool(executed),
            metadata=metadata,
        )

    def to_dict(self) -> dict[str, Any]:
        data = ProcessState.to_dict(self)
        data["routing"] = {
            "session_id": self.session_id,
            "input": self.input,
            "resolved_input": self.resolved_input,
            "intent": None if self.intent is None else self.intent.model_dump(mode="json"),
            "context": None if self.context is None else self.context.to_dict(),
        }
        return data

    @classmethod
    def fields_from_dict(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        routing = data.get("routing") or {}
        intent, context = routing.get("intent"), routing.get("context")
        return {
            **cls.base_fields_from_dict(data),
            "session_id": routing.get("session_id"),
            "input": str(routing.get("input", "")),
            "resolved_input": routing.get("resolved_input"),
            "intent": None if intent is None else Intent.model_validate(intent),
            "context": None if context is None else SessionContext.from_dict(context),
        }


def default_classifier(registry: CapabilityRegistry) -> RuleBasedClassifier:
    """A request naming a capability (as a word) selects it; anything else goes to
    the first capability with the request as its ``text`` argument."""
    rules = [Rule(c.name, rf"\b{re.escape(c.name)}\b") for c in registry]
    return RuleBasedClassifier(rules, default=next(iter(registry.names()), None))


class CapabilityRouter(StepByStep[RoutingState, RoutingStep]):
    """Routes requests to capabilities (see the module docstring).

    Args:
        capabilities: a registry, or capabilities / typed functions.
        classifier: the intent classifier (default :func:`default_classifier`).
        decider: the continuation decider (default :class:`NoOpContinuationDecider`).
        resolver: the reference resolver (default: none).
        memory: session memory (default: in this process).
        max_steps: capability executions per request.
        criteria: replaces the default criteria (steps limit, error policy, decider).
        error_policy: how errors are judged (default: stop on any error).
        processors, events, clock: see :class:`~agent_core.orchestrators.stepbystep.StepByStep`.
    """

    process = "routing"

    def __init__(
        self,
        capabilities: CapabilityRegistry | Iterable[Capability | Callable[..., Any]],
        classifier: IntentClassifier | None = None,
        *,
        decider: ContinuationDecider | None = None,
        resolver: ReferenceResolver | None = None,
        memory: SessionMemory | None = None,
        max_steps: int = ROUTING_MAX_STEPS,
        criteria: ContinuationCriteria[RoutingState] | None = None,
        error_policy: ErrorPolicy | None = None,
        processors: Iterable[ProcessorLike[RoutingState]] | None = None,
        events: EventDispatcher | None = None,
        clock: Clock = utc_now,
    ) -> None:
        policy = error_policy or ErrorPolicy.stop_on_any_error()
        default = ContinuationCriteria[RoutingState](
            StepsLimit(max_steps), ErrorPolicyCriterion(policy), DeciderCriterion()
        )
        super().__init__(
            criteria or default,
            processors=processors,
            error_policy=policy,
            events=events,
            clock=clock,
        )
        registry = (
            capabilities
            if isinstance(capabilities, CapabilityRegistry)
            else CapabilityRegistry(capabilities)
        )
        if not len(registry):
            raise ValueError("a CapabilityRouter needs at least one capability")
        self.registry = registry
        self.classifier: IntentClassifier = classifier or default_classifier(registry)
        self.decider: ContinuationDecider = decider or NoOpContinuationDecider()
        self.resolver = resolver
        self.memory: SessionMemory = memory or InMemorySessionMemory()

    def actors(self) -> tuple[str, ...]:
        return self.registry.names()

    def available_tools(self, state: RoutingState) -> tuple[str, ...]:
        return self.registry.names()

    async def new_state(self, user_input: str, session_id: str | None = None) -> RoutingState:
        """A state for one request, with the session's context loaded.

        Raises:
            ValueError: the input is empty.
        """
        if not user_input.strip():
            raise ValueError("the request input must not be empty")
        context = None if session_id is None else await self.memory.load(session_id)
        state = RoutingState(session_id=session_id, input=user_input, context=context)
        if session_id is not None:
            state = state.with_metadata("session_id", session_id)
        return state.with_user_message(user_input)

    async def handle(
        self, user_input: str, session_id: str | None = None, *, execution_id: str | None = None
    ) -> RoutingState:
        """Serve one request and return the final state (errors are recorded in it,
        not raised; :meth:`RoutingState.result` is the answer).

        Raises:
            ValueError: the input is empty.
        """
        state = await self.new_state(user_input, session_id)
        return await self.final_step(state, execution_id=execution_id)

    # -- steps ----------------------------------------------------------------------------

    async def prepare_step(self, state: RoutingState, context: StepContext) -> RoutingState:
        results = state.execution_results()
        if not results:
            state, intent = await self._classify(state, context)
            return self._select(
                state,
                context,
                intent.capability,
                intent.arguments,
                self.classifier.name,
                intent.reason,
                intent.usage,
            )
        last = results[-1]
        decision = last.step.decision
        if last.step.errors and (decision is None or decision.done):
            reason = f"retrying {last.step.capability} after a failed step"
            return self._select(
                state, context, last.step.capability, last.step.arguments, "retry", reason, Usage()
            )
        assert decision is not None, "a recorded step that continues has a decision"
        assert decision.next_capability is not None, "only a decision naming one continues"
        reason = f"the {self.decider.name} decider asked for it"
        return self._select(
            state,
            context,
            decision.next_capability,
            decision.arguments,
            self.decider.name,
            reason,
            Usage(),
        )

    def _select(
        self,
        state: RoutingState,
        context: StepContext,
        capability: str,
        arguments: Mapping[str, Any],
        selector: str,
        reason: str,
        usage: Usage,
    ) -> RoutingState:
        self.events.emit(
            CapabilitySelected(
                **self._meta(state),
                step_number=context.step_number,
                actor=capability,
                selector=selector,
                reason=reason,
                arguments=arguments,
            )
        )
        selection = {
            "selector": selector,
            "reason": reason,
            "arguments": dict(arguments),
            "usage": usage.model_dump(mode="json"),
        }
        return state.with_actor(capability, selection)

    async def _classify(
        self, state: RoutingState, context: StepContext
    ) -> tuple[RoutingState, Intent]:
        usage = Usage()
        if self.resolver is not None and state.context is not None and state.context.turns:
            started = self.clock()
            resolution = await self.resolver.resolve(state.input, state.context)
            usage = usage + resolution.usage
            state = replace(state, resolved_input=resolution.text)
            await context.emit(
                ReferencesResolved(
                    **self._meta(state),
                    call_id=f"resolve_{new_id()}",
                    original=state.input,
                    resolved=resolution.text,
                    duration_ms=elapsed_ms(started, self.clock()),
                    step_number=context.step_number,
                )
            )
        started = self.clock()
        intent = await self.classifier.classify(state.request_text(), state.context)
        await context.emit(
            IntentClassified(
                **self._meta(state),
                call_id=f"classify_{new_id()}",
                classifier=self.classifier.name,
                message=state.request_text(),
                capability=intent.capability,
                arguments=intent.arguments,
                reason=intent.reason,
                duration_ms=elapsed_ms(started, self.clock()),
                confidence=intent.confidence,
                step_number=context.step_number,
            )
        )
        intent = intent.model_copy(update={"usage": intent.usage + usage})
        return replace(state, intent=intent), intent

    async def make_next_step(self, state: RoutingState, context: StepContext) -> RoutingStep:
        current = state.current
        assert current is not None, "a step is in progress"
        assert current.actor is not None, "prepare_step chose the capability"
        name, arguments = current.actor, dict(current.selection.get("arguments") or {})
        capability = self.registry.get(name)
        call = ToolCall(id=f"cap_{new_id()}", name=name, arguments=arguments)
        result, error = await self._execute(capability, call, context)
        result = result.model_copy(
            update={
                "metadata": {
                    **result.metadata,
                    "session_id": state.session_id,
                    "step_number": context.step_number,
                    "started_at": to_iso(current.started_at),
                    "duration_ms": round(elapsed_ms(current.started_at, self.clock()), 3),
                }
            }
        )
        history = [r.step.result for r in state.execution_results() if r.step.result is not None]
        decision, decider_error = await self._decide(state, name, result, history, context)
        chosen = Usage.model_validate(current.selection.get("usage") or {})
        message = Message(role=Role.ASSISTANT, content=result.output, metadata={"capability": name})
        return RoutingStep(
            id=current.id,
            capability=name,
            arguments=arguments,
            call_id=call.id,
            result=result,
            decision=decision,
            decider_error=decider_error,
            errors=() if error is None else (StepError.from_error(error),),
            usage=chosen + result.usage + (Usage() if decision is None else decision.usage),
            messages=() if error is not None and not result.output else (message,),
        )

    async def _decide(
        self,
        state: RoutingState,
        name: str,
        result: CapabilityResult,
        history: list[CapabilityResult],
        context: StepContext,
    ) -> tuple[ContinuationResult | None, str | None]:
        """Ask the decider; a decider that raises gives no decision and its error (the
        capability's result must not be lost to it)."""
        started = self.clock()
        decision: ContinuationResult | None = None
        error: str | None = None
        try:
            decision = await self.decider.decide(state.request_text(), name, result, history)
        except Exception as exc:
            error = AgentError.from_exception(exc).message
            logger.warning("the %s continuation decider failed: %s", self.decider.name, error)
        await context.emit(
            ContinuationDecided(
                **self._meta(state),
                call_id=f"decide_{new_id()}",
                decider=self.decider.name,
                capability=name,
                success=result.success,
                decision=decision,
                error=error,
                duration_ms=elapsed_ms(started, self.clock()),
                step_number=context.step_number,
            )
        )
        return decision, error

    async def _execute(
        self, capability: Capability, call: ToolCall, context: StepContext
    ) -> tuple[CapabilityResult, ToolError | None]:
        """Run the capability; a failure (it raised, or reported ``success: false``) is
        a result too, so the decider sees it, with the error the step records."""
        await context.tool_started(call)
        started = self.clock()
        calling = CAPABILITY_CALL.set(call.id)
        try:
            result = await capability.execute(call.arguments)
        except Exception as exc:
            CAPABILITY_CALL.reset(calling)
            message = AgentError.from_exception(exc).message
            duration = elapsed_ms(started, self.clock())
            await context.tool_result(call, False, message, duration, "")
            failed = CapabilityResult(
                capability=call.name, output="", success=False, metadata={"error": message}
            )
            return failed, _capability_error(call, f"failed: {message}")
        CAPABILITY_CALL.reset(calling)
        duration = elapsed_ms(started, self.clock())
        if result.success:
            await context.tool_result(call, True, None, duration, result.output)
            return result, None
        why = str(result.metadata.get("error") or result.output or "no reason given")
        failure = f"the capability reported failure: {why}"
        await context.tool_result(call, False, failure, duration, result.output)
        return result, _capability_error(call, f"reported failure: {why}")

    def failure_step(self, state: RoutingState, error: AgentError) -> RoutingStep:
        current = state.current
        return RoutingStep(
            id="" if current is None else current.id,
            capability=(None if current is None else current.actor) or "(unclassified)",
            arguments={} if current is None else dict(current.selection.get("arguments") or {}),
            errors=(StepError.from_error(error),),
        )

    async def before_finish(self, state: RoutingState) -> RoutingState:
        """Append the request to session memory (failed requests too, marked so)."""
        if state.session_id is None:
            return state
        answer = state.result()
        turn = SessionTurn(
            input=state.input,
            output=state.final_response(),
            capability=None if answer is None else answer.capability,
            success=answer is not None and answer.success,
            resolved_input=state.resolved_input,
        )
        started = self.clock()
        context = await self.memory.append(state.session_id, turn)
        results = state.execution_results()
        self.events.emit(
            SessionMemoryAppended(
                **self._meta(state),
                session_id=state.session_id,
                turns=len(context.turns),
                call_id=f"remember_{new_id()}",
                capability=turn.capability,
                success=turn.success,
                duration_ms=elapsed_ms(started, self.clock()),
                step_number=results[-1].step_number if results else None,
            )
        )
        return state


def _capability_error(call: ToolCall, what: str) -> ToolError:
    return ToolError(f"capability {call.name!r} {what}", tool_name=call.name, tool_call_id=call.id)
