"""Error policy: what a recorded error means for continuation.

An :class:`ErrorPolicy` maps each :class:`~agent_core.errors.ErrorType` to an
:class:`ErrorAction` (stop, retry, ignore). :class:`ErrorPolicyCriterion` applies it to
the current step: stop -> forbid (``error``); retry -> request another step while the
consecutive failures stay within ``max_retries`` (with stop reason ``error``: if a guard
forbids the retry, the run stops for the error), then forbid (``error``); ignore ->
allow, the only way an error is tolerated when the run stops. :class:`ErrorHandler`
turns an exception raised during a step into a recorded failure step and its outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from agent_core.continuation import (
    ContinuationCriteria,
    ContinuationDecision,
    ContinuationEvaluation,
    ContinuationOutcome,
    StopReason,
)
from agent_core.criteria import CountsFailures, ErrorPresenceCheck
from agent_core.errors import AgentError, ErrorType
from agent_core.state import AgentState, AgentStatus
from agent_core.steps import AgentStep

__all__ = [
    "ErrorAction",
    "ErrorHandler",
    "ErrorHandling",
    "ErrorPolicy",
    "ErrorPolicyCriterion",
]


class ErrorAction(StrEnum):
    """What to do about an error type (listed from the mildest to the strictest)."""

    IGNORE = "ignore"
    RETRY = "retry"
    STOP = "stop"


_STRICTNESS = {action: rank for rank, action in enumerate(ErrorAction)}


@dataclass(frozen=True, slots=True)
class ErrorPolicy:
    """How each error type is handled; ``max_retries`` bounds consecutive failed steps
    that a ``retry`` action tolerates.

    Use the presets: :meth:`stop_on_any_error`, :meth:`retry_tool_errors`,
    :meth:`ignore_tool_errors`, :meth:`retry_all`.
    """

    name: str
    tool: ErrorAction = ErrorAction.STOP
    validation: ErrorAction = ErrorAction.STOP
    model: ErrorAction = ErrorAction.STOP
    rate_limit: ErrorAction = ErrorAction.STOP
    timeout: ErrorAction = ErrorAction.STOP
    unknown: ErrorAction = ErrorAction.STOP
    max_retries: int = 0

    def __post_init__(self) -> None:
        for error_type in ErrorType:
            action = getattr(self, error_type.value)
            if action not in _STRICTNESS:
                raise ValueError(
                    f"ErrorPolicy {self.name!r}: action for {error_type} errors must be one "
                    f"of {', '.join(ErrorAction)}, got {action!r}"
                )
        if self.max_retries < 0:
            raise ValueError(f"ErrorPolicy {self.name!r}: max_retries must be 0 or more")

    def action_for(self, error_type: ErrorType) -> ErrorAction:
        return ErrorAction(getattr(self, error_type.value))

    @classmethod
    def stop_on_any_error(cls) -> ErrorPolicy:
        """Any error stops the run as failed (the agent default)."""
        return cls("stop_on_any_error")

    @classmethod
    def retry_tool_errors(cls, max_retries: int = 3) -> ErrorPolicy:
        """Tool and argument-validation errors go back to the model up to
        ``max_retries`` times in a row; other errors stop."""
        retry = ErrorAction.RETRY
        return cls("retry_tool_errors", tool=retry, validation=retry, max_retries=max_retries)

    @classmethod
    def ignore_tool_errors(cls) -> ErrorPolicy:
        """Tool and validation errors are reported to the model and otherwise ignored;
        other errors stop."""
        ignore = ErrorAction.IGNORE
        return cls("ignore_tool_errors", tool=ignore, validation=ignore)

    @classmethod
    def retry_all(cls, max_retries: int = 3) -> ErrorPolicy:
        """Every error is retried up to ``max_retries`` times in a row."""
        r = ErrorAction.RETRY
        return cls("retry_all", r, r, r, r, r, r, max_retries=max_retries)


class ErrorPolicyCriterion:
    """Applies an :class:`ErrorPolicy` to the current step's errors."""

    name = "ErrorPolicyCriterion"

    def __init__(self, policy: ErrorPolicy | None = None) -> None:
        self.policy = policy or ErrorPolicy.stop_on_any_error()

    def evaluate(self, state: CountsFailures) -> ContinuationEvaluation:
        step = state.current_step()
        if step is None or not step.errors:
            return self._answer(ContinuationDecision.ALLOW, "allowed: no errors")
        worst = max(step.errors, key=lambda e: _STRICTNESS[self.policy.action_for(e.error_type)])
        action = self.policy.action_for(worst.error_type)
        described = f"{worst.error_type} error ({worst.message})"
        if action is ErrorAction.IGNORE:
            return self._answer(ContinuationDecision.ALLOW, f"allowed: ignoring {described}")
        if action is ErrorAction.STOP:
            why = f"forbade continuation: {described}; policy {self.policy.name} stops on it"
            return self._answer(ContinuationDecision.FORBID, why, StopReason.ERROR)
        return self._retry(state.trailing_failed_steps(), described)

    def _retry(self, failures: int, described: str) -> ContinuationEvaluation:
        limit = self.policy.max_retries
        if failures > limit:
            why = (
                f"forbade continuation: {described}; {failures} failed steps in a row "
                f"exhaust the {limit} retries of policy {self.policy.name}"
            )
            return self._answer(ContinuationDecision.FORBID, why, StopReason.ERROR, failures)
        why = f"requested a retry after {described}: retry {failures} of {limit}"
        # If a guard forbids the retry, the error stands: the run stops for it.
        return self._answer(ContinuationDecision.REQUEST, why, StopReason.ERROR, failures)

    def _answer(
        self,
        decision: ContinuationDecision,
        why: str,
        stop_reason: StopReason | None = None,
        failures: int | None = None,
    ) -> ContinuationEvaluation:
        context: dict[str, object] = {"policy": self.policy.name}
        if failures is not None:
            context["failed_steps"] = failures
        return ContinuationEvaluation(
            self.name, decision, f"{self.name} {why}", context, stop_reason
        )


@dataclass(frozen=True, slots=True)
class ErrorHandling:
    """What an error during a step amounts to."""

    failure_step: AgentStep
    outcome: ContinuationOutcome
    final_status: AgentStatus


class ErrorHandler:
    """Judges an exception raised during a step.

    The failure step is recorded on a transition state and the criteria judge it. If
    the criteria contain nothing that judges errors, the handler's own policy does, so
    an error can never end a run as ``completed``.
    """

    def __init__(
        self, criteria: ContinuationCriteria[AgentState], policy: ErrorPolicy | None = None
    ) -> None:
        self.criteria = criteria
        self.policy_criterion = ErrorPolicyCriterion(policy)
        self._judges_errors = criteria.contains(ErrorPolicyCriterion) or criteria.contains(
            ErrorPresenceCheck
        )

    def handle(self, error: AgentError, state: AgentState) -> ErrorHandling:
        """Build the failure step for ``error`` (raised during ``state``'s current step)
        and judge it."""
        current = state.current_execution
        step = AgentStep.failure(current.id if current else "", error)
        transition = state.record_step(step)
        outcome = self.criteria.evaluate_all(transition)
        if not self._judges_errors:
            outcome = outcome.with_evaluation(self.policy_criterion.evaluate(transition))
        failed = not outcome.should_continue and outcome.stop_reason is StopReason.ERROR
        return ErrorHandling(step, outcome, AgentStatus.FAILED if failed else state.status)
