"""Full serialization: every state round-trips through JSON; bad data is explained."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings

from agent_core.serialization import FullAgentStateSerializer, SerializationError
from agent_core.state import AgentState
from tests.agent_core.strategies import agent_states

SERIALIZER = FullAgentStateSerializer()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(agent_states)
def test_any_state_round_trips_through_json(state: AgentState) -> None:
    data = json.loads(json.dumps(state.to_dict()))
    assert AgentState.from_dict(data) == state
    assert SERIALIZER.loads(SERIALIZER.dumps(state)) == state


def test_current_error_survives_as_type_and_message() -> None:
    from agent_core.errors import ErrorType, RateLimitError
    from tests.agent_core.factories import T0

    state = AgentState().start_execution(T0).with_error(RateLimitError("429"))
    restored = SERIALIZER.loads(SERIALIZER.dumps(state))
    error = restored.current_error()
    assert isinstance(error, RateLimitError)
    assert (error.error_type, error.message) == (ErrorType.RATE_LIMIT, "429")


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
