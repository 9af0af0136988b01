"""Messages and token usage (the vocabulary shared by state, tools and drivers)."""

from __future__ import annotations

import orjson

from agent_core.messages import Usage
from agent_core.slim import SlimAgentStateSerializer
from agent_core.state import AgentState
from broadcaster.envelope import MAX_WIRE_INT


def test_usage_saturates_at_what_the_wire_holds() -> None:
    """A model's 10**20 tokens, and the sum of two runs' 2**63, stay a number every
    envelope, stored state and JavaScript reader holds exactly (orjson could not write
    the sum of two 2**63 at all: it poisoned the session's next run)."""
    huge = Usage(prompt=10**20, completion=3, total=10**20 + 3)
    assert huge == Usage(prompt=MAX_WIRE_INT, completion=3, total=MAX_WIRE_INT)
    twice = Usage.of(2**63, 2**63) + Usage.of(2**63, 2**63)
    assert twice == Usage(prompt=MAX_WIRE_INT, completion=MAX_WIRE_INT, total=MAX_WIRE_INT)
    orjson.dumps(twice.model_dump())


def test_a_stored_state_with_a_huge_usage_loads_bounded() -> None:
    serializer = SlimAgentStateSerializer()  # what runs store and continue from
    data = serializer.serialize(AgentState())
    data["usage"] = {"prompt": 2**63, "completion": 0, "total": 2**63}
    assert serializer.deserialize(data).usage.prompt == MAX_WIRE_INT
