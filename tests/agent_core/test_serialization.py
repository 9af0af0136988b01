"""Full serialization: every state round-trips through JSON; bad data is explained."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings

from agent_core.serialization import FullAgentStateSerializer, SerializationError
from agent_core.state import AgentState
from tests.support.strategies import agent_states

SERIALIZER = FullAgentStateSerializer()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(agent_states)
def test_any_state_round_trips_through_json(state: AgentState) -> None:
    """Everything but the transient current execution survives."""
    data = json.loads(json.dumps(state.to_dict()))
    kept = replace(state, current_execution=None)
    assert AgentState.from_dict(data) == kept
    assert SERIALIZER.loads(SERIALIZER.dumps(state)) == kept


def test_the_current_execution_is_transient() -> None:
    """The step in progress (here its error) is never serialized; older data that
    still carries one loads without it."""
    from agent_core.errors import RateLimitError
    from tests.support.factories import T0

    state = AgentState().start_execution(T0).with_error(RateLimitError("429"))
    assert "current_execution" not in state.to_dict()
    restored = SERIALIZER.loads(SERIALIZER.dumps(state))
    assert (restored.current_execution, restored.current_error()) == (None, None)
    current = state.current_execution
    assert current is not None
    older = {**state.to_dict(), "current_execution": current.to_dict()}
    assert AgentState.from_dict(older).current_execution is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "serialized agent state is missing the field 'agent_id'"),
        ({"agent_id": "a", "status": "sleeping"}, "has an invalid value: 'sleeping'"),
        ([], "must be a JSON object, got list"),
    ],
)
def test_bad_data_is_explained(data: object, message: str) -> None:
    with pytest.raises(SerializationError, match=message):
        SERIALIZER.deserialize(data)  # type: ignore[arg-type]


def test_bad_json_is_explained() -> None:
    with pytest.raises(SerializationError, match="not valid JSON"):
        SERIALIZER.loads("{nope")
