"""Continuation: should a step-by-step process take another step?

Generic over the state being judged (agents today; tool-use, chat and collaboration
orchestrators later). Each criterion answers one :class:`ContinuationDecision`; the
:class:`ContinuationCriteria` collection evaluates *all* of them (no short-circuit) and
aggregates the answers into a :class:`ContinuationOutcome`:

1. any ``forbid`` -> stop;
2. else continue if there is a ``request``, or an ``allow`` and no ``stop``;
3. no evaluations at all -> stop.

So a ``request`` beats a ``stop``, and a lone ``allow`` bootstraps the first step.
Guards (limits, error checks) answer forbid/allow; work drivers (tool calls present,
response content) answer request/stop.

Who decided (``resolved_by``) and why (``stop_reason``): a stop on a forbid is decided
by the first evaluation with stop reason ``error`` if there is one (errors win over
limits judged in the same evaluation; an error's retry request that a forbid overrode
counts, as the retry cannot happen), else by the first forbid; a stop with no forbid by
the first criterion that proposed it (``stop``); a continuation by the first
``request``. ``"aggregate"`` only when no single criterion decided.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from agent_core._frozen import FrozenDict, freeze_mapping, thaw

__all__ = [
    "AGGREGATE",
    "CallableCriterion",
    "ContinuationCriteria",
    "ContinuationCriterion",
    "ContinuationDecision",
    "ContinuationEvaluation",
    "ContinuationOutcome",
    "CriterionResult",
    "StartsWithExecution",
    "StopReason",
    "criterion_name",
    "should_continue",
]

logger = logging.getLogger(__name__)

StateT = TypeVar("StateT")
StateT_contra = TypeVar("StateT_contra", contravariant=True)

AGGREGATE = "aggregate"

"""``resolved_by`` of an outcome that no single criterion decided."""


class ContinuationDecision(StrEnum):
    """One criterion's answer."""

    FORBID = "forbid"
    """A guard vetoes another step (always wins)."""
    ALLOW = "allow"
    """A guard has no objection."""
    REQUEST = "request"
    """A work driver asks for another step (beats ``stop``)."""
    STOP = "stop"
    """A work driver sees nothing more to do (AllowStop)."""


class StopReason(StrEnum):
    """Why a process stopped."""

    COMPLETED = "completed"
    STEPS_LIMIT = "steps_limit"
    TOKEN_LIMIT = "token_limit"  # noqa: S105 (a stop reason, not a secret)
    TIME_LIMIT = "time_limit"
    RETRY_LIMIT = "retry_limit"
    ERROR = "error"
    FINISH_REASON = "finish_reason"
    GUARD = "guard"
    USER_REQUESTED = "user_requested"


_ERROR_DECISIONS = frozenset({ContinuationDecision.FORBID, ContinuationDecision.REQUEST})


@dataclass(frozen=True, slots=True)
class ContinuationEvaluation:
    """One criterion's decision with a human-readable reason and machine context.

    ``stop_reason`` is why the process stops because of this evaluation: on a forbid,
    the reason it stops; on an error's retry request, the reason it stops if a guard
    forbids the retry (``error``).
    """

    criterion: str
    decision: ContinuationDecision
    reason: str
    context: Mapping[str, Any] = field(default_factory=FrozenDict)
    stop_reason: StopReason | None = None

    def __post_init__(self) -> None:
        # The context is part of the record: read-only, all the way down.
        object.__setattr__(self, "context", freeze_mapping(self.context))

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (see :meth:`from_dict`)."""
        return {
            "criterion": self.criterion,
            "decision": self.decision.value,
            "reason": self.reason,
            "context": thaw(self.context),
            "stop_reason": None if self.stop_reason is None else self.stop_reason.value,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ContinuationEvaluation:
        """Rebuild from :meth:`to_dict` output.

        Raises:
            KeyError, ValueError: ``data`` is not an evaluation's dict.
        """
        stop_reason = data.get("stop_reason")
        return cls(
            criterion=str(data["criterion"]),
            decision=ContinuationDecision(data["decision"]),
            reason=str(data["reason"]),
            context=dict(data.get("context") or {}),
            stop_reason=None if stop_reason is None else StopReason(stop_reason),
        )


def should_continue(evaluations: Sequence[ContinuationEvaluation]) -> bool:
    """The aggregation rule (see the module docstring)."""
    decisions = {evaluation.decision for evaluation in evaluations}
    if not decisions or ContinuationDecision.FORBID in decisions:
        return False
    if ContinuationDecision.REQUEST in decisions:
        return True
    return ContinuationDecision.ALLOW in decisions and ContinuationDecision.STOP not in decisions


@dataclass(frozen=True, slots=True)
class ContinuationOutcome:
    """All evaluations of one decision point and whether to continue.

    ``resolved_by``, ``stop_reason`` and ``decision`` are derived from the evaluations.
    """

    should_continue: bool
    evaluations: tuple[ContinuationEvaluation, ...] = ()

    @classmethod
    def from_evaluations(cls, evaluations: Iterable[ContinuationEvaluation]) -> ContinuationOutcome:
        """Aggregate evaluations with the rule of :func:`should_continue`."""
        items = tuple(evaluations)
        return cls(should_continue=should_continue(items), evaluations=items)

    def _first(self, decision: ContinuationDecision) -> ContinuationEvaluation | None:
        return next((e for e in self.evaluations if e.decision is decision), None)

    def deciding_forbid(self) -> ContinuationEvaluation | None:
        """What decides a stop on a forbid: errors win, so the first evaluation with
        stop reason ``error`` (a forbid, or an error's retry request that a forbid
        overrode: the retry cannot happen, so the error stands), else the first
        forbid. ``None`` when nothing forbade."""
        forbids = [e for e in self.evaluations if e.decision is ContinuationDecision.FORBID]
        if self.should_continue or not forbids:
            return None
        errors = (e for e in self.evaluations if e.stop_reason is StopReason.ERROR)
        return next((e for e in errors if e.decision in _ERROR_DECISIONS), forbids[0])

    def deciding_evaluation(self) -> ContinuationEvaluation | None:
        """The evaluation that decided the outcome, if one did (see :attr:`resolved_by`)."""
        if self.should_continue:
            return self._first(ContinuationDecision.REQUEST)
        return self.deciding_forbid() or self._first(ContinuationDecision.STOP)

    @property
    def resolved_by(self) -> str:
        """Who decided: when stopping, the deciding forbid's criterion (see
        :meth:`deciding_forbid`), else the first criterion that proposed the stop;
        when continuing, the first requesting criterion; ``"aggregate"`` when no single
        criterion decided (no evaluations, or continuing on allows alone)."""
        decided = self.deciding_evaluation()
        return AGGREGATE if decided is None else decided.criterion

    @property
    def stop_reason(self) -> StopReason:
        """The deciding forbid's stop reason (``guard`` if it gave none; see
        :meth:`deciding_forbid`), else ``completed``."""
        forbid = self.deciding_forbid()
        if forbid is None:
            return StopReason.COMPLETED
        return forbid.stop_reason or StopReason.GUARD

    @property
    def is_forbidden(self) -> bool:
        """Whether a guard forbade continuing (a hook can never override that)."""
        return self._first(ContinuationDecision.FORBID) is not None

    @property
    def decision(self) -> ContinuationDecision:
        """The aggregate as one decision: ``request``/``allow`` when continuing,
        ``forbid``/``stop`` when stopping."""
        if self.should_continue:
            requested = self._first(ContinuationDecision.REQUEST) is not None
            return ContinuationDecision.REQUEST if requested else ContinuationDecision.ALLOW
        return ContinuationDecision.FORBID if self.is_forbidden else ContinuationDecision.STOP

    def with_evaluation(self, evaluation: ContinuationEvaluation) -> ContinuationOutcome:
        """A new outcome with one more evaluation, re-aggregated."""
        return ContinuationOutcome.from_evaluations((*self.evaluations, evaluation))

    def summary(self) -> dict[str, Any]:
        """The decision in three fields (the slim snapshot's ``last_continuation``):
        ``should_continue``, ``stop_reason``, ``resolved_by``."""
        return {
            "should_continue": self.should_continue,
            "stop_reason": self.stop_reason.value,
            "resolved_by": self.resolved_by,
        }

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form; derived fields are included for readers but ignored on load."""
        return {
            "should_continue": self.should_continue,
            "resolved_by": self.resolved_by,
            "stop_reason": self.stop_reason.value,
            "decision": self.decision.value,
            "evaluations": [e.to_dict() for e in self.evaluations],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ContinuationOutcome:
        """Rebuild from :meth:`to_dict` output (the stored ``should_continue`` is kept)."""
        return cls(
            should_continue=bool(data["should_continue"]),
            evaluations=tuple(ContinuationEvaluation.from_dict(e) for e in data["evaluations"]),
        )


class ContinuationCriterion(Protocol[StateT_contra]):
    """Judges a state. Its name (``name`` attribute, else the class name) identifies it
    in evaluations."""

    def evaluate(self, state: StateT_contra) -> ContinuationEvaluation:
        """Answer one decision about ``state``."""
        ...


@runtime_checkable
class StartsWithExecution(Protocol):
    """A criterion that must know when an execution started (e.g. a time limit)."""

    def execution_started(self, now: datetime) -> None:
        """Note that an execution started at ``now``."""
        ...


def criterion_name(criterion: object) -> str:
    """The criterion's ``name`` attribute if it has a text one, else its class name."""
    name = getattr(criterion, "name", None)
    return name if isinstance(name, str) and name else type(criterion).__name__


CriterionResult = bool | ContinuationDecision | ContinuationEvaluation


class CallableCriterion(Generic[StateT]):
    """A criterion from a plain function of the state.

    The function returns a :class:`ContinuationEvaluation`, a
    :class:`ContinuationDecision`, or a bool (``True`` -> allow, ``False`` -> forbid with
    stop reason ``guard``).
    """

    def __init__(self, function: Callable[[StateT], CriterionResult], name: str = "") -> None:
        self.function = function
        self.name = name or getattr(function, "__name__", "") or "CallableCriterion"

    def evaluate(self, state: StateT) -> ContinuationEvaluation:
        result = self.function(state)
        if isinstance(result, ContinuationEvaluation):
            return result
        if isinstance(result, ContinuationDecision):
            stop = StopReason.GUARD if result is ContinuationDecision.FORBID else None
            return ContinuationEvaluation(
                self.name, result, f"{self.name} answered {result}", {}, stop
            )
        if result:
            return ContinuationEvaluation(
                self.name, ContinuationDecision.ALLOW, f"{self.name} allowed"
            )
        return ContinuationEvaluation(
            self.name,
            ContinuationDecision.FORBID,
            f"{self.name} forbade continuation",
            stop_reason=StopReason.GUARD,
        )


class ContinuationCriteria(Generic[StateT]):
    """An ordered collection of criteria, evaluated together.

    Args:
        criteria: criterion objects, or plain callables (wrapped in
            :class:`CallableCriterion`).
    """

    def __init__(
        self,
        *criteria: ContinuationCriterion[StateT] | Callable[[StateT], CriterionResult],
    ) -> None:
        self.criteria: tuple[ContinuationCriterion[StateT], ...] = tuple(
            _as_criterion(c) for c in criteria
        )

    def __len__(self) -> int:
        return len(self.criteria)

    def with_criteria(
        self, *criteria: ContinuationCriterion[StateT] | Callable[[StateT], CriterionResult]
    ) -> ContinuationCriteria[StateT]:
        """A new collection with ``criteria`` appended."""
        return ContinuationCriteria(*self.criteria, *criteria)

    def contains(self, kind: type[object]) -> bool:
        """Whether any criterion is an instance of ``kind``."""
        return any(isinstance(c, kind) for c in self.criteria)

    def execution_started(self, now: datetime) -> None:
        """Tell criteria that time an execution (see :class:`StartsWithExecution`)."""
        for criterion in self.criteria:
            if isinstance(criterion, StartsWithExecution):
                criterion.execution_started(now)

    def evaluate_all(self, state: StateT) -> ContinuationOutcome:
        """Evaluate every criterion and aggregate. A criterion that raises becomes a
        ``forbid`` evaluation with stop reason ``error``; it never propagates."""
        return ContinuationOutcome.from_evaluations(_safe_evaluate(c, state) for c in self.criteria)

    def can_continue(self, state: StateT) -> bool:
        """Shortcut for ``evaluate_all(state).should_continue``."""
        return self.evaluate_all(state).should_continue


def _as_criterion(
    item: ContinuationCriterion[StateT] | Callable[[StateT], CriterionResult],
) -> ContinuationCriterion[StateT]:
    if hasattr(item, "evaluate"):
        return item
    if callable(item):
        return CallableCriterion(item)
    raise TypeError(
        f"a continuation criterion needs an evaluate(state) method or must be callable, "
        f"got {type(item).__name__}"
    )


def _safe_evaluate(
    criterion: ContinuationCriterion[StateT], state: StateT
) -> ContinuationEvaluation:
    name = criterion_name(criterion)
    try:
        evaluation = criterion.evaluate(state)
    except Exception as exc:
        logger.exception("continuation criterion %s raised", name)
        return _failed(name, f"{name} raised {type(exc).__name__}: {exc}", type(exc).__name__)
    if not isinstance(evaluation, ContinuationEvaluation):
        got = type(evaluation).__name__
        return _failed(name, f"{name} returned {got}, expected a ContinuationEvaluation", got)
    return evaluation


def _failed(name: str, reason: str, detail: str) -> ContinuationEvaluation:
    return ContinuationEvaluation(
        name, ContinuationDecision.FORBID, reason, {"error": detail}, StopReason.ERROR
    )
