"""Continuation: the aggregation rule, derived outcome fields and criteria collections."""

from __future__ import annotations

import pytest

from agent_core.continuation import (
    AGGREGATE,
    CallableCriterion,
    ContinuationCriteria,
    ContinuationDecision,
    ContinuationEvaluation,
    ContinuationOutcome,
    StopReason,
    should_continue,
)

F, A, R, S = (
    ContinuationDecision.FORBID,
    ContinuationDecision.ALLOW,
    ContinuationDecision.REQUEST,
    ContinuationDecision.STOP,
)


def evaluations(*decisions: ContinuationDecision) -> tuple[ContinuationEvaluation, ...]:
    return tuple(
        ContinuationEvaluation(
            f"C{i}-{d.value}",
            d,
            "because",
            stop_reason=StopReason.STEPS_LIMIT if d is F and i == 0 else None,
        )
        for i, d in enumerate(decisions)
    )


# decisions, continue?, resolved_by, stop_reason, aggregate decision
AGGREGATION_TABLE = [
    ((), False, AGGREGATE, StopReason.COMPLETED, S),
    ((A,), True, AGGREGATE, StopReason.COMPLETED, A),
    ((S,), False, "C0-stop", StopReason.COMPLETED, S),
    ((R,), True, "C0-request", StopReason.COMPLETED, R),
    ((F,), False, "C0-forbid", StopReason.STEPS_LIMIT, F),
    ((A, S), False, "C1-stop", StopReason.COMPLETED, S),
    ((A, R), True, "C1-request", StopReason.COMPLETED, R),
    ((S, R), True, "C1-request", StopReason.COMPLETED, R),
    ((A, S, R), True, "C2-request", StopReason.COMPLETED, R),
    ((A, A), True, AGGREGATE, StopReason.COMPLETED, A),
    ((A, R, F), False, "C2-forbid", StopReason.GUARD, F),
    ((F, R, R), False, "C0-forbid", StopReason.STEPS_LIMIT, F),
    ((R, F, F), False, "C1-forbid", StopReason.GUARD, F),
    ((S, S), False, "C0-stop", StopReason.COMPLETED, S),
]


@pytest.mark.parametrize(
    ("decisions", "continues", "resolved_by", "stop_reason", "decision"), AGGREGATION_TABLE
)
def test_aggregation_rule(
    decisions: tuple[ContinuationDecision, ...],
    continues: bool,
    resolved_by: str,
    stop_reason: StopReason,
    decision: ContinuationDecision,
) -> None:
    """Forbid wins; request beats stop; a lone allow continues; nothing at all stops."""
    items = evaluations(*decisions)
    outcome = ContinuationOutcome.from_evaluations(items)
    assert should_continue(items) is continues
    assert outcome.should_continue is continues
    assert outcome.resolved_by == resolved_by
    assert outcome.stop_reason is stop_reason
    assert outcome.decision is decision


def test_outcome_round_trips_through_dict() -> None:
    outcome = ContinuationOutcome.from_evaluations(evaluations(A, R, F))
    data = outcome.to_dict()
    assert data["resolved_by"] == "C2-forbid"
    assert data["stop_reason"] == "guard"
    assert ContinuationOutcome.from_dict(data) == outcome


def test_criteria_evaluate_every_criterion_without_short_circuit() -> None:
    seen: list[str] = []

    def first(state: int) -> bool:
        seen.append("first")
        return False

    def second(state: int) -> bool:
        seen.append("second")
        return True

    outcome = ContinuationCriteria(first, second).evaluate_all(0)
    assert seen == ["first", "second"]
    assert [e.decision for e in outcome.evaluations] == [F, A]
    assert outcome.resolved_by == "first"
    assert outcome.stop_reason is StopReason.GUARD


def test_raising_criterion_becomes_forbid_with_error_reason() -> None:
    def broken(state: int) -> bool:
        raise ZeroDivisionError("division by zero")

    outcome = ContinuationCriteria(broken, lambda s: ContinuationDecision.REQUEST).evaluate_all(0)
    assert not outcome.should_continue
    assert outcome.stop_reason is StopReason.ERROR
    assert outcome.resolved_by == "broken"
    assert outcome.evaluations[0].reason == "broken raised ZeroDivisionError: division by zero"


def test_criterion_returning_garbage_becomes_forbid() -> None:
    class Wrong:
        def evaluate(self, state: int) -> ContinuationEvaluation:
            return "yes"  # type: ignore[return-value]

    outcome = ContinuationCriteria[int](Wrong()).evaluate_all(0)
    assert outcome.stop_reason is StopReason.ERROR
    assert "returned str, expected a ContinuationEvaluation" in outcome.evaluations[0].reason


@pytest.mark.parametrize(
    ("result", "decision", "stop_reason"),
    [
        (True, A, None),
        (False, F, StopReason.GUARD),
        (ContinuationDecision.REQUEST, R, None),
        (ContinuationDecision.FORBID, F, StopReason.GUARD),
        (ContinuationDecision.STOP, S, None),
    ],
)
def test_callable_criterion_translates_results(
    result: bool | ContinuationDecision,
    decision: ContinuationDecision,
    stop_reason: StopReason | None,
) -> None:
    evaluation = CallableCriterion[int](lambda s: result, name="mine").evaluate(0)
    assert (evaluation.criterion, evaluation.decision) == ("mine", decision)
    assert evaluation.stop_reason is stop_reason


def test_callable_criterion_may_return_a_full_evaluation() -> None:
    given = ContinuationEvaluation("custom", R, "more please", {"k": 1})
    assert CallableCriterion[int](lambda s: given).evaluate(0) is given


def test_non_criterion_is_rejected_with_a_clear_error() -> None:
    with pytest.raises(TypeError, match="needs an evaluate\\(state\\) method"):
        ContinuationCriteria(42)  # type: ignore[arg-type]


def test_with_criteria_returns_a_new_collection() -> None:
    base = ContinuationCriteria[int](lambda s: True)
    more = base.with_criteria(lambda s: False)
    assert (len(base), len(more)) == (1, 2)
    assert base.can_continue(0)
    assert not more.can_continue(0)
