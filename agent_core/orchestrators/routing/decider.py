"""Continuation deciders (docs/agent_core.md, routing): after each capability execution,
is the request done, or should another capability run?

A decider returns a structured :class:`ContinuationResult` (done, next_capability,
arguments, final_output). :class:`NoOpContinuationDecider` (the default) is always
done; :class:`ModelContinuationDecider` asks a model for the JSON object.
:class:`DeciderCriterion` turns the result into a continuation evaluation (``request``
while not done, ``stop`` when done), so the router's loop is bounded by the usual
criteria and the decision appears in the continuation trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from agent_core._structured import parse_structured
from agent_core.continuation import ContinuationDecision, ContinuationEvaluation
from agent_core.drivers.base import ModelDriver, ModelRequest, complete
from agent_core.errors import ValidationError
from agent_core.messages import Message, Usage
from agent_core.orchestrators.routing.capabilities import CapabilityRegistry, CapabilityResult

__all__ = [
    "ContinuationDecider",
    "ContinuationResult",
    "DeciderCriterion",
    "ModelContinuationDecider",
    "NoOpContinuationDecider",
]


class ContinuationResult(BaseModel):
    """A decider's structured answer.

    Attributes:
        done: nothing more to run.
        next_capability: when not done, the capability to run next.
        arguments: its arguments.
        final_output: an optional synthesized reply (replaces the last output).
        usage: tokens the decision cost.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    done: bool = True
    next_capability: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    final_output: str | None = None
    usage: Usage = Usage()


class ContinuationDecider(Protocol):
    """Decides after each capability execution."""

    @property
    def name(self) -> str: ...

    async def decide(
        self,
        user_input: str,
        capability: str,
        result: CapabilityResult,
        history: Sequence[CapabilityResult] = (),
    ) -> ContinuationResult:
        """``history``: earlier results of the same request, oldest first."""
        ...


class NoOpContinuationDecider:
    """Always done: the capability's output is the answer (no model call)."""

    name = "noop"

    async def decide(
        self,
        user_input: str,
        capability: str,
        result: CapabilityResult,
        history: Sequence[CapabilityResult] = (),
    ) -> ContinuationResult:
        return ContinuationResult(done=True)


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    done: bool
    next_capability: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)
    final_output: str | None = None


class ModelContinuationDecider:
    """A model reads the request and the results so far and answers
    ``{"done": bool, "next_capability": str|null, "arguments": {}, "final_output": str|null}``.

    Raises (from :meth:`decide`):
        agent_core.errors.ValidationError: the answer is not that JSON object, or is
            not done without naming a next capability.
        agent_core.errors.ModelError: the model failed.
    """

    name = "model"

    def __init__(
        self,
        driver: ModelDriver,
        registry: CapabilityRegistry | None = None,
        *,
        instructions: str | None = None,
    ) -> None:
        self.driver = driver
        self.registry = registry
        self.instructions = instructions or (
            "Decide whether the user's request is fully served by the results so far. "
            'Answer with one JSON object: {"done": true|false, "next_capability": '
            '"<name>"|null, "arguments": {...}, "final_output": "<reply>"|null}.'
        )

    def _request(
        self, user_input: str, result: CapabilityResult, history: Sequence[CapabilityResult]
    ) -> ModelRequest:
        system = self.instructions
        if self.registry is not None:
            system += f"\n\nCapabilities:\n{self.registry.describe()}"
        results = "\n".join(_line(r) for r in (*history, result))
        return ModelRequest(
            messages=(
                Message.system(system),
                Message.user(f"Request: {user_input}\n\nResults so far:\n{results}"),
            )
        )

    async def decide(
        self,
        user_input: str,
        capability: str,
        result: CapabilityResult,
        history: Sequence[CapabilityResult] = (),
    ) -> ContinuationResult:
        response = await complete(self.driver, self._request(user_input, result, history))
        answer = parse_structured(response.content, _Answer, "the continuation decider's answer")
        if not answer.done and not answer.next_capability:
            raise ValidationError(
                "the continuation decider answered done=false without a next_capability; "
                "name the capability to run next or answer done=true"
            )
        return ContinuationResult(**answer.model_dump(), usage=response.usage)


def _line(result: CapabilityResult) -> str:
    """A result for the model: ``<capability> (ok|failed[: error]): <output>``."""
    if result.success:
        return f"{result.capability} (ok): {result.output}"
    error = result.metadata.get("error")
    return f"{result.capability} (failed{f': {error}' if error else ''}): {result.output}"


class _DecidedStep(Protocol):
    @property
    def decision(self) -> ContinuationResult | None: ...

    @property
    def decider_error(self) -> str | None: ...


class _HasDecidedStep(Protocol):
    def current_step(self) -> _DecidedStep | None: ...


class DeciderCriterion:
    """The decider's result as a continuation evaluation: ``request`` while not done
    (context: next capability and arguments), ``stop`` when done, ``stop`` when the
    decider failed (the capability's output stands; context: the error), ``allow``
    when there is no decision (before the first step, or after a failed one)."""

    def __init__(self, name: str = "ContinuationDecider") -> None:
        self.name = name

    def evaluate(self, state: _HasDecidedStep) -> ContinuationEvaluation:
        step = state.current_step()
        decision = None if step is None else step.decision
        if step is not None and decision is None and step.decider_error is not None:
            why = f"{self.name} failed ({step.decider_error}); the capability's output stands"
            context = {"error": step.decider_error}
            return ContinuationEvaluation(self.name, ContinuationDecision.STOP, why, context)
        if decision is None:
            return ContinuationEvaluation(
                self.name, ContinuationDecision.ALLOW, f"{self.name} allowed: no decision yet"
            )
        context = decision.model_dump(mode="json", exclude={"usage"})
        if decision.done:
            why = f"{self.name} allowed stopping: the request is done"
            return ContinuationEvaluation(self.name, ContinuationDecision.STOP, why, context)
        why = f"{self.name} requested another step: run {decision.next_capability}"
        return ContinuationEvaluation(self.name, ContinuationDecision.REQUEST, why, context)
