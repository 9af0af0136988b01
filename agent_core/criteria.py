"""Built-in continuation criteria.

Criteria read the state through small protocols (below), so any step-by-step
orchestrator whose state offers the needed methods can use them. Counts, usage and
failures are those of the *current execution* (one run): a conversation resumed for a
new run gets a fresh step budget.

Guards answer forbid/allow: :class:`StepsLimit`, :class:`TokenUsageLimit`,
:class:`ExecutionTimeLimit`, :class:`CumulativeExecutionTimeLimit`, :class:`RetryLimit`,
:class:`ErrorPresenceCheck`, :class:`FinishReasonCheck`. Work drivers answer
request/stop: :class:`ToolCallPresenceCheck`, :class:`ResponseContentCheck`. The error
policy's criterion lives in :mod:`agent_core.error_policy`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol

from agent_core._time import Clock, elapsed_seconds, utc_now
from agent_core.continuation import ContinuationDecision, ContinuationEvaluation, StopReason
from agent_core.errors import ErrorType
from agent_core.messages import FinishReason, Usage

__all__ = [
    "CountsFailures",
    "CountsSteps",
    "CumulativeExecutionTimeLimit",
    "ErrorPresenceCheck",
    "ErrorRecord",
    "ExecutionTimeLimit",
    "FinishReasonCheck",
    "HasCurrentStep",
    "JudgedStep",
    "ReportsUsage",
    "ResponseContentCheck",
    "RetryLimit",
    "StepsLimit",
    "TokenUsageLimit",
    "ToolCallPresenceCheck",
    "TracksCumulativeTime",
]

FORBID = ContinuationDecision.FORBID
ALLOW = ContinuationDecision.ALLOW
REQUEST = ContinuationDecision.REQUEST
STOP = ContinuationDecision.STOP


class ErrorRecord(Protocol):
    """A recorded error as criteria see it."""

    @property
    def error_type(self) -> ErrorType: ...

    @property
    def message(self) -> str: ...


class JudgedStep(Protocol):
    """A step as criteria see it."""

    @property
    def content(self) -> str: ...

    @property
    def finish_reason(self) -> FinishReason | None: ...

    @property
    def errors(self) -> Sequence[ErrorRecord]: ...

    def has_tool_calls(self) -> bool: ...


class CountsSteps(Protocol):
    def execution_step_count(self) -> int:
        """Steps of the current execution, including the one being judged."""
        ...


class ReportsUsage(Protocol):
    def execution_usage(self) -> Usage:
        """Tokens used by the current execution, including the step being judged."""
        ...


class HasCurrentStep(Protocol):
    def current_step(self) -> JudgedStep | None:
        """The step being judged; ``None`` before the execution's first step."""
        ...


class CountsFailures(HasCurrentStep, Protocol):
    def trailing_failed_steps(self) -> int:
        """Consecutive steps with errors, ending with the current one."""
        ...


class TracksCumulativeTime(Protocol):
    def cumulative_execution_seconds(self, now: datetime) -> float:
        """Execution time over all runs (paused time excluded), as of ``now``."""
        ...


_VERBS = {
    FORBID: "forbade continuation",
    ALLOW: "allowed continuation",
    REQUEST: "requested another step",
    STOP: "allowed stopping",
}


def _evaluation(
    name: str,
    decision: ContinuationDecision,
    reason: str,
    stop_reason: StopReason | None = None,
    context: dict[str, Any] | None = None,
) -> ContinuationEvaluation:
    reason = f"{name} {_VERBS[decision]}: {reason}"
    return ContinuationEvaluation(name, decision, reason, context or {}, stop_reason)


def _positive(value: float, what: str) -> None:
    if value <= 0:
        raise ValueError(f"{what} must be positive, got {value}")


class StepsLimit:
    """Forbid once the execution has taken ``max_steps`` steps (step 20 of 20 stops)."""

    name = "StepsLimit"

    def __init__(self, max_steps: int) -> None:
        _positive(max_steps, "max_steps")
        self.max_steps = max_steps

    def evaluate(self, state: CountsSteps) -> ContinuationEvaluation:
        step, limit = state.execution_step_count(), self.max_steps
        context = {"step": step, "limit": limit}
        if step >= limit:
            reason = f"step {step} reached limit {limit}"
            return _evaluation(self.name, FORBID, reason, StopReason.STEPS_LIMIT, context)
        return _evaluation(self.name, ALLOW, f"step {step} of {limit}", None, context)


class TokenUsageLimit:
    """Forbid once the execution has used ``max_tokens`` tokens (total) or more."""

    name = "TokenUsageLimit"

    def __init__(self, max_tokens: int) -> None:
        _positive(max_tokens, "max_tokens")
        self.max_tokens = max_tokens

    def evaluate(self, state: ReportsUsage) -> ContinuationEvaluation:
        used, limit = state.execution_usage().total, self.max_tokens
        context = {"used": used, "limit": limit}
        if used >= limit:
            reason = f"{used} tokens used reached limit {limit}"
            return _evaluation(self.name, FORBID, reason, StopReason.TOKEN_LIMIT, context)
        return _evaluation(self.name, ALLOW, f"{used} of {limit} tokens used", None, context)


class ExecutionTimeLimit:
    """Forbid once ``max_seconds`` have passed since :meth:`execution_started`.

    Holds the start of the execution being timed, so one instance times one execution
    at a time. Before it is started it allows.

    Args:
        max_seconds: the limit.
        clock: the time source (inject one in tests).
    """

    name = "ExecutionTimeLimit"

    def __init__(self, max_seconds: float, clock: Clock = utc_now) -> None:
        _positive(max_seconds, "max_seconds")
        self.max_seconds = max_seconds
        self.clock = clock
        self.started_at: datetime | None = None

    def execution_started(self, now: datetime) -> None:
        self.started_at = now

    def evaluate(self, state: object) -> ContinuationEvaluation:
        if self.started_at is None:
            return _evaluation(self.name, ALLOW, "execution not started yet")
        elapsed = elapsed_seconds(self.started_at, self.clock())
        return _time_evaluation(self.name, elapsed, self.max_seconds)


class CumulativeExecutionTimeLimit:
    """Forbid once the execution time summed over all runs reaches ``max_seconds``.

    Reads the time from the state, so it survives pause/resume and serialization.
    """

    name = "CumulativeExecutionTimeLimit"

    def __init__(self, max_seconds: float, clock: Clock = utc_now) -> None:
        _positive(max_seconds, "max_seconds")
        self.max_seconds = max_seconds
        self.clock = clock

    def evaluate(self, state: TracksCumulativeTime) -> ContinuationEvaluation:
        elapsed = state.cumulative_execution_seconds(self.clock())
        return _time_evaluation(self.name, elapsed, self.max_seconds)


def _time_evaluation(name: str, elapsed: float, limit: float) -> ContinuationEvaluation:
    context = {"elapsed_seconds": round(elapsed, 3), "limit_seconds": limit}
    if elapsed >= limit:
        reason = f"{elapsed:.1f} s elapsed reached limit {limit:g} s"
        return _evaluation(name, FORBID, reason, StopReason.TIME_LIMIT, context)
    return _evaluation(name, ALLOW, f"{elapsed:.1f} s of {limit:g} s elapsed", None, context)


class RetryLimit:
    """Forbid when more than ``max_retries`` steps in a row failed (with 2 retries the
    third consecutive failure stops)."""

    name = "RetryLimit"

    def __init__(self, max_retries: int) -> None:
        if max_retries < 0:
            raise ValueError(f"max_retries must be 0 or more, got {max_retries}")
        self.max_retries = max_retries

    def evaluate(self, state: CountsFailures) -> ContinuationEvaluation:
        failures, limit = state.trailing_failed_steps(), self.max_retries
        context = {"failed_steps": failures, "max_retries": limit}
        if failures > limit:
            reason = f"{failures} failed steps in a row exceed {limit} retries"
            return _evaluation(self.name, FORBID, reason, StopReason.RETRY_LIMIT, context)
        return _evaluation(self.name, ALLOW, f"{failures} failed steps in a row", None, context)


class ErrorPresenceCheck:
    """Forbid when the current step recorded any error."""

    name = "ErrorPresenceCheck"

    def evaluate(self, state: HasCurrentStep) -> ContinuationEvaluation:
        step = state.current_step()
        if step is None or not step.errors:
            return _evaluation(self.name, ALLOW, "no errors")
        first = step.errors[0]
        reason = f"{len(step.errors)} error(s), first: {first.error_type} error: {first.message}"
        return _evaluation(
            self.name, FORBID, reason, StopReason.ERROR, {"errors": len(step.errors)}
        )


class FinishReasonCheck:
    """Forbid when the model's finish reason is one of ``finish_reasons``."""

    name = "FinishReasonCheck"

    def __init__(self, finish_reasons: Iterable[FinishReason | str]) -> None:
        self.finish_reasons = frozenset(FinishReason(r) for r in finish_reasons)
        if not self.finish_reasons:
            raise ValueError("FinishReasonCheck needs at least one finish reason to stop on")

    def evaluate(self, state: HasCurrentStep) -> ContinuationEvaluation:
        step = state.current_step()
        reason = None if step is None else step.finish_reason
        if reason is not None and reason in self.finish_reasons:
            context = {"finish_reason": reason.value}
            why = f"finish reason '{reason}'"
            return _evaluation(self.name, FORBID, why, StopReason.FINISH_REASON, context)
        shown = "none" if reason is None else f"'{reason}'"
        return _evaluation(self.name, ALLOW, f"finish reason {shown}")


class ToolCallPresenceCheck:
    """Request another step while the model calls tools; stop when it does not."""

    name = "ToolCallPresenceCheck"

    def evaluate(self, state: HasCurrentStep) -> ContinuationEvaluation:
        step = state.current_step()
        if step is None:
            return _evaluation(self.name, ALLOW, "no step yet")
        if step.has_tool_calls():
            return _evaluation(self.name, REQUEST, "tool calls present")
        return _evaluation(self.name, STOP, "no tool calls")


class ResponseContentCheck:
    """Request another step while ``predicate(content)`` is true for the current step's
    response text; stop otherwise.

    Args:
        predicate: ``True`` when the content calls for another step.
        name: the criterion name in evaluations.
    """

    def __init__(
        self, predicate: Callable[[str], bool], name: str = "ResponseContentCheck"
    ) -> None:
        self.predicate = predicate
        self.name = name

    def evaluate(self, state: HasCurrentStep) -> ContinuationEvaluation:
        step = state.current_step()
        if step is None:
            return _evaluation(self.name, ALLOW, "no step yet")
        if self.predicate(step.content):
            return _evaluation(self.name, REQUEST, "response content calls for another step")
        return _evaluation(self.name, STOP, "response content is final")
