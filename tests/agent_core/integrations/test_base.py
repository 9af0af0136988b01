"""What every framework adapter shares (:class:`agent_core.integrations._base.FrameworkRun`):
a framework's hostile numbers and unencodable data never hide the run's end."""

from __future__ import annotations

import orjson

from agent_core.integrations._base import FrameworkRun
from broadcaster import envelope as env
from broadcaster.publishers import RecordingPublisher


class Store:
    """A state store that keeps what it is given."""

    def __init__(self) -> None:
        self.saved: list[bytes] = []

    async def save(self, channel: str, snapshot: bytes) -> None:
        self.saved.append(snapshot)


def final_of(publisher: RecordingPublisher) -> env.StatusPayload:
    last = publisher.envelopes()[-1]
    assert isinstance(last, env.AgentStatus)
    return last.payload


async def test_a_frameworks_token_counts_are_bounded_where_they_enter() -> None:
    publisher, store = RecordingPublisher(), Store()
    run = FrameworkRun(publisher, "s-1", "x-1", framework="test", state_store=store)
    await run.started("hi")
    await run.step_started()
    await run.step_completed(input_tokens=10**20, output_tokens=-4)
    await run.completed("done")
    final = final_of(publisher)
    assert final.status == "completed"
    assert final.usage == env.UsagePayload(prompt=2**53 - 1, completion=0, total=2**53 - 1)
    assert orjson.loads(store.saved[-1])["usage"]["prompt"] == 2**53 - 1


async def test_an_output_and_arguments_json_cannot_carry_end_failed_saying_why() -> None:
    """A tool's arguments with an integer past 64 bits (orjson cannot write it) made the
    snapshot unstorable; the run now ends failed, its state stored failed, both saying
    where."""
    publisher, store = RecordingPublisher(), Store()
    run = FrameworkRun(publisher, "s-1", "x-1", framework="test", state_store=store)
    await run.started("hi")
    await run.step_started()
    await run.tool_started("c1", "add", {"n": 10**20})
    await run.tool_completed("c1", result={"sum": 10**21})
    await run.completed({"answer": 10**22})
    final = final_of(publisher)
    assert (final.status, final.stop_reason) == ("failed", "error")
    assert final.error_message is not None
    assert "held what JSON cannot carry" in final.error_message
    assert final.state_url is not None
    stored = orjson.loads(store.saved[-1])
    assert stored["status"] == "failed"
    assert stored["error_message"] == final.error_message
