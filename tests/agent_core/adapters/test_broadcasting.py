"""The envelope adapter: agent events in, ordered envelopes out."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import jsonschema
import orjson
import pytest

from agent_core.adapters.broadcasting import (
    AdapterOptions,
    AgentEventAdapter,
    split_text,
    summarize_args,
    summarize_result,
    text_size,
)
from agent_core.app.demo_tools import demo_driver, demo_tools
from agent_core.app.runs import PacedDriver
from agent_core.builder import AgentBuilder
from agent_core.drivers.base import ModelDriver
from agent_core.drivers.scripted import ScriptedDriver, ScriptedResponse, call
from agent_core.hooks import HookPoint
from agent_core.state import AgentState
from agent_core.tools import Tool
from broadcaster.envelope import Envelope, json_schema
from broadcaster.publishers import PublisherStats, RecordingPublisher

QUESTION = "What is the weather in Oslo?"
DEMO_TYPES = [
    "agent.status",
    "agent.step.started",
    "agent.stream.chunk",
    "agent.tool.started",
    "agent.tool.completed",
    "agent.step.completed",
    "agent.step.started",
    "agent.tool.started",
    "agent.tool.completed",
    "agent.step.completed",
    "agent.step.started",
    "agent.stream.chunk",
    "agent.step.completed",
    "agent.status",
]


async def run(
    driver: ModelDriver,
    *,
    options: AdapterOptions | None = None,
    builder: AgentBuilder | None = None,
    final_state: Any = None,
    publisher: Any = None,
) -> tuple[list[Envelope], AgentState, AgentEventAdapter]:
    publisher = publisher or RecordingPublisher()
    adapter = AgentEventAdapter(publisher, "s-1", "x-1", options=options, final_state=final_state)
    base = builder or AgentBuilder().with_tools(*demo_tools())
    agent = adapter.install(base.with_driver(driver)).build()
    state = await agent.run(QUESTION)
    await adapter.aclose()
    records = publisher.envelopes() if isinstance(publisher, RecordingPublisher) else []
    return records, state, adapter


async def test_demo_run_publishes_the_expected_ordered_envelopes() -> None:
    envelopes, state, _ = await run(demo_driver(QUESTION))
    assert [e.type for e in envelopes] == DEMO_TYPES
    assert [e.payload.status for e in envelopes if e.type == "agent.status"] == [  # type: ignore[union-attr]
        "in_progress",
        "completed",
    ]
    schema = json_schema()
    for envelope in envelopes:
        jsonschema.validate(orjson.loads(envelope.to_json()), schema)
        assert (envelope.session_id, envelope.execution_id) == ("s-1", "x-1")
    assert state.step_count() == 3


async def test_tool_envelopes_carry_real_ids_and_summaries() -> None:
    envelopes, _, _ = await run(demo_driver(QUESTION))
    started = [e.payload for e in envelopes if e.type == "agent.tool.started"]
    completed = [e.payload for e in envelopes if e.type == "agent.tool.completed"]
    assert [p.tool_call_id for p in started] == ["call_weather_1", "call_calc_1"]  # type: ignore[union-attr]
    assert started[0].args_summary == "city: 'Oslo'"  # type: ignore[union-attr]
    assert all(p.success and p.result_summary for p in completed)  # type: ignore[union-attr]
    steps = [e.payload for e in envelopes if e.type == "agent.step.completed"]
    assert [c.id for c in steps[0].tool_calls] == ["call_weather_1"]  # type: ignore[union-attr]


async def test_final_status_reports_usage_and_the_last_response() -> None:
    envelopes, state, _ = await run(demo_driver(QUESTION))
    final = envelopes[-1].payload
    assert final.status == "completed"  # type: ignore[union-attr]
    assert final.stop_reason == "completed"  # type: ignore[union-attr]
    assert final.step_count == 3  # type: ignore[union-attr]
    assert final.usage.total == state.usage.total  # type: ignore[union-attr]
    assert final.last_response == state.final_response()  # type: ignore[union-attr]


async def test_continuation_trace_is_off_by_default_and_on_when_asked() -> None:
    quiet, _, _ = await run(demo_driver(QUESTION))
    assert "agent.continuation" not in [e.type for e in quiet]
    summary = next(e.payload for e in quiet if e.type == "agent.step.completed")
    assert summary.continuation.resolved_by == "ToolCallPresenceCheck"  # type: ignore[union-attr]

    traced, _, _ = await run(
        demo_driver(QUESTION), options=AdapterOptions(include_continuation_trace=True)
    )
    trace = [e.payload for e in traced if e.type == "agent.continuation"]
    assert [t.should_continue for t in trace] == [True, True, False]  # type: ignore[union-attr]
    criteria = {ev.criterion for ev in trace[-1].evaluations}  # type: ignore[union-attr]
    assert {"StepsLimit", "ToolCallPresenceCheck"} <= criteria
    # each trace comes right before its step's completion
    types = [e.type for e in traced]
    for index, kind in enumerate(types):
        if kind == "agent.continuation":
            assert types[index + 1] == "agent.step.completed"


def words(count: int) -> str:
    return " ".join(f"w{i}" for i in range(count))


async def test_fast_streams_are_coalesced_into_few_publishes() -> None:
    text = words(100)
    driver = ScriptedDriver([ScriptedResponse(text=text)])
    envelopes, _, _ = await run(driver, options=AdapterOptions(coalesce_deltas=16))
    chunks = [e.payload for e in envelopes if e.type == "agent.stream.chunk"]
    assert len(chunks) == 7  # ceil(100 / 16): the last one completes the stream
    assert "".join(c.chunk for c in chunks) == text  # type: ignore[union-attr]
    assert [c.chunk_index for c in chunks] == list(range(7))  # type: ignore[union-attr]
    assert [c.is_complete for c in chunks][-1] is True  # type: ignore[union-attr]


async def test_slow_streams_are_flushed_by_the_delay_in_order() -> None:
    text = words(12)
    driver = PacedDriver(ScriptedDriver([ScriptedResponse(text=text)]), 0.02)
    options = AdapterOptions(coalesce_deltas=1000, coalesce_seconds=0.05)
    envelopes, _, _ = await run(driver, options=options)
    types = [e.type for e in envelopes]
    chunks = [e.payload for e in envelopes if e.type == "agent.stream.chunk"]
    assert len(chunks) >= 2, "the timer published text before the stream completed"
    assert "".join(c.chunk for c in chunks) == text  # type: ignore[union-attr]
    assert types.index("agent.step.completed") > max(
        i for i, t in enumerate(types) if t == "agent.stream.chunk"
    )


# -- one shared flush for every adapter of a process -----------------------------------------


class TaskRecordingPublisher(RecordingPublisher):
    """Records which task published each envelope; ``waits``: says it may wait."""

    def __init__(self, waits: bool = False) -> None:
        super().__init__()
        self.tasks: list[asyncio.Task[Any] | None] = []
        if waits:
            self.never_waits = False  # type: ignore[misc]

    async def broadcast(self, channel: str, envelope: Envelope) -> None:
        self.tasks.append(asyncio.current_task())
        await super().broadcast(channel, envelope)


def _chunk(step: int = 1, text: str = "hi", complete: bool = False) -> Any:
    from datetime import UTC, datetime

    from agent_core import events as ev

    return ev.StreamChunk(
        agent_id="a",
        execution_id="x-1",
        occurred_at=datetime.now(UTC),
        step_number=step,
        text_delta=text,
        chunk_index=0,
        is_complete=complete,
    )


async def test_held_text_of_many_adapters_is_flushed_together_by_one_task() -> None:
    """Adapters that began holding text at different moments are flushed by one timer,
    in one task, one after the other (one batch for a buffered publisher)."""
    publisher = TaskRecordingPublisher()
    options = AdapterOptions(coalesce_seconds=0.02)
    adapters = [AgentEventAdapter(publisher, f"s-{i}", "x-1", options=options) for i in range(5)]
    for adapter in adapters:
        await adapter.on_event(_chunk())
        await asyncio.sleep(0.001)
    assert publisher.records == []  # held
    for _ in range(200):
        if len(publisher.records) == 5:
            break
        await asyncio.sleep(0.01)
    assert [ch for ch, _ in publisher.records] == [f"agent.s-{i}" for i in range(5)]
    assert len(set(publisher.tasks)) == 1
    assert publisher.tasks[0] is not asyncio.current_task()
    for adapter in adapters:
        await adapter.aclose()
    assert len(publisher.records) == 5  # nothing held twice


async def test_an_adapter_whose_publisher_may_wait_or_that_is_busy_is_flushed_alone() -> None:
    """A publisher that may wait (one round trip per publication) would hold up every
    other session's text: its adapter gets a flush task of its own; so does one whose
    lock is held when the timer fires."""
    buffered, waiting = TaskRecordingPublisher(), TaskRecordingPublisher(waits=True)
    options = AdapterOptions(coalesce_seconds=0.02)
    a = AgentEventAdapter(buffered, "s-a", "x-1", options=options)
    b = AgentEventAdapter(buffered, "s-b", "x-1", options=options)
    c = AgentEventAdapter(waiting, "s-c", "x-1", options=options)
    busy = AgentEventAdapter(buffered, "s-busy", "x-1", options=options)
    for adapter in (a, b, c, busy):
        await adapter.on_event(_chunk())
    async with busy._lock:
        for _ in range(200):
            if len(buffered.records) == 2 and waiting.records:
                break
            await asyncio.sleep(0.01)
        assert [ch for ch, _ in buffered.records] == ["agent.s-a", "agent.s-b"]
    assert [ch for ch, _ in waiting.records] == ["agent.s-c"]
    assert waiting.tasks[0] not in buffered.tasks
    for adapter in (a, b, c, busy):
        await adapter.aclose()
    assert [ch for ch, _ in buffered.records][-1] == "agent.s-busy"  # flushed once free
    assert len(buffered.records) == 3


async def test_text_flushed_by_its_adapter_first_is_not_flushed_again() -> None:
    publisher = TaskRecordingPublisher()
    adapter = AgentEventAdapter(publisher, "s-1", "x-1", options=AdapterOptions())
    await adapter.on_event(_chunk(text="a"))
    await adapter.on_event(_chunk(text="b", complete=True))  # flushes at once
    await asyncio.sleep(0.08)  # past the delay: the shared timer was released
    chunks = [e.payload for e in publisher.envelopes()]
    assert [c.chunk for c in chunks] == ["ab"]  # type: ignore[union-attr]
    assert [c.is_complete for c in chunks] == [True]  # type: ignore[union-attr]


# -- large text: chunks within max_chunk_bytes ---------------------------------------------

MIXED = 'plain ASCII, "quotes" \\ back\tslash\n, é ü ß, € ✓, 😀 🚀 𝄞, \x01\x1f ctrl; '
TEXTS = {
    "ascii": "a" * 50_000,
    "mixed": MIXED * 700,
    "astral": "😀" * 20_000,
    "escapes": '"\\\n\x00' * 10_000,
    "lone surrogates": (
        "ab\ud83d\ude00c\ud800" * 3_000
    ),  # as text decoded with surrogatepass has them
}


@pytest.mark.parametrize("limit", [12, 64, 1000, 8192])
@pytest.mark.parametrize("name", list(TEXTS))
def test_split_text_keeps_the_text_and_each_piece_within_the_limit(name: str, limit: int) -> None:
    text = TEXTS[name]
    pieces = split_text(text, limit)
    assert "".join(pieces) == text
    assert all(0 < text_size(piece) <= limit for piece in pieces)
    for piece, after in itertools.pairwise(pieces):
        # never between the halves of a surrogate pair; otherwise as long as it can be
        pair = "\ud800" <= piece[-1] <= "\udbff" and "\udc00" <= after[0] <= "\udfff"
        assert not pair
        assert text_size(piece + after[:1]) > limit or "\ud800" <= after[0] <= "\udfff"


def test_text_size_is_what_the_text_adds_to_an_envelope() -> None:
    from broadcaster.envelope import StreamChunk, StreamChunkPayload

    def envelope(text: str) -> int:
        payload = StreamChunkPayload(chunk=text)
        return len(StreamChunk(session_id="s", execution_id="x", payload=payload).to_json())

    for text in ("", MIXED, "😀", '"\\', "\x00\n"):
        assert envelope(text) - envelope("") == text_size(text)


def test_a_chunk_bound_below_any_character_is_refused() -> None:
    with pytest.raises(ValueError, match="max_chunk_bytes must be at least 64"):
        AdapterOptions(max_chunk_bytes=32)


async def streamed(chunks: tuple[str, ...], session_id: str = "s-1") -> list[Envelope]:
    """The envelopes of a one-step run whose model streams ``chunks``."""
    publisher = RecordingPublisher()
    adapter = AgentEventAdapter(publisher, session_id, "x-1")
    text = "".join(chunks)
    driver = ScriptedDriver([ScriptedResponse(text=text, chunks=chunks)])
    await adapter.install(AgentBuilder().with_driver(driver)).build().run(QUESTION)
    await adapter.aclose()
    return publisher.envelopes()


@pytest.mark.parametrize(
    "deltas",
    [
        pytest.param(("a" * 300_000, "b" * 300_000), id="2 x 300,000"),
        pytest.param((MIXED * 600, "x", MIXED * 900), id="multibyte"),
        pytest.param(tuple("é" * 1000 for _ in range(40)), id="40 x 1,000 coalesced"),
    ],
)
async def test_large_deltas_become_consecutive_chunks_that_fit_a_pusher_event(
    deltas: tuple[str, ...],
) -> None:
    """A delta longer than max_chunk_bytes is split, coalescing stops before the bound:
    every envelope fits a Pusher event (10,240 bytes of data) even with the longest
    session id, and the chunks join, in chunk_index order, to exactly the model's text."""
    envelopes = await streamed(deltas, session_id="s" * 128)
    chunks = [e.payload for e in envelopes if e.type == "agent.stream.chunk"]
    assert all(len(e.to_json()) <= 10_240 for e in envelopes)
    assert "".join(c.chunk for c in chunks) == "".join(deltas)  # type: ignore[union-attr]
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))  # type: ignore[union-attr]
    assert [c.is_complete for c in chunks] == [False] * (len(chunks) - 1) + [True]  # type: ignore[union-attr]
    assert sum(c.tokens_delta for c in chunks) == len(deltas)  # type: ignore[union-attr]
    assert len(chunks) <= 2 * sum(text_size(d) for d in deltas) // 8192 + 2  # not needlessly many


async def test_stream_chunks_can_be_turned_off() -> None:
    envelopes, _, _ = await run(
        demo_driver(QUESTION), options=AdapterOptions(include_stream_chunks=False)
    )
    assert "agent.stream.chunk" not in [e.type for e in envelopes]


@pytest.mark.parametrize(
    ("args", "options", "expected"),
    [
        ({"city": "Oslo"}, {}, "city: 'Oslo'"),
        ({"n": 3, "flag": True}, {}, "n: 3, flag: true"),
        ({"q": "x" * 40}, {}, "q: '" + "x" * 26 + "..."),
        ({"a": 1, "b": 2, "c": 3, "d": 4}, {}, "a: 1, b: 2, c: 3, (+1 more)"),
        ({"token": "secret"}, {"redact": True}, "token: [redacted]"),
        ({"nested": {"k": [1, 2]}}, {}, 'nested: {"k":[1,2]}'),
    ],
)
def test_argument_summaries(args: dict[str, Any], options: dict[str, Any], expected: str) -> None:
    assert summarize_args(args, **options) == expected


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (None, None),
        ("3", "3"),
        ({"ok": True}, '{"ok":true}'),
        ("y" * 150, "y" * 97 + "..."),
    ],
)
def test_result_summaries(result: Any, expected: str | None) -> None:
    assert summarize_result(result) == expected


async def test_redaction_reaches_the_tool_envelopes() -> None:
    envelopes, _, _ = await run(
        demo_driver(QUESTION), options=AdapterOptions(redact_tool_args=True)
    )
    started = [e.payload for e in envelopes if e.type == "agent.tool.started"]
    assert all("[redacted]" in p.args_summary for p in started)  # type: ignore[union-attr]
    assert not any("Oslo" in p.args_summary for p in started)  # type: ignore[union-attr]


async def test_arguments_too_long_for_an_event_are_left_out_of_the_envelope() -> None:
    """An envelope must fit a Pusher event (10,240 bytes of data; the Pusher HTTP
    publisher's target refuses more, and the envelope was dropped) and a subscriber's
    buffer: arguments over max_arguments_bytes are null, their summary stays."""
    short = call("calculator", "call_s", expression="6 * 7")
    long = call("calculator", "call_l", expression="1+" * 3_000 + "1")
    driver = ScriptedDriver([ScriptedResponse(tool_calls=(short, long)), ScriptedResponse()])
    envelopes, _, _ = await run(driver, options=AdapterOptions(max_arguments_bytes=2_000))
    started = {
        p.tool_call_id: p  # type: ignore[union-attr]
        for p in (e.payload for e in envelopes if e.type == "agent.tool.started")
    }
    assert started["call_s"].arguments == {"expression": "6 * 7"}
    assert started["call_l"].arguments is None
    assert started["call_l"].args_summary.startswith("expression: '1+1+")
    biggest = max(len(orjson.dumps(e.model_dump(mode="json"))) for e in envelopes)
    assert biggest < 10_240


def test_the_arguments_limit_cannot_be_negative() -> None:
    with pytest.raises(ValueError, match="max_arguments_bytes cannot be negative"):
        AdapterOptions(max_arguments_bytes=-1)


def explode(reason: str) -> str:
    """Always fails."""
    raise RuntimeError(f"tool broke: {reason}")


async def test_a_failing_tool_ends_in_a_failed_status_with_the_error() -> None:
    driver = ScriptedDriver([ScriptedResponse(tool_calls=(call("explode", "call_x", reason="r"),))])
    builder = AgentBuilder().with_tools(Tool.from_function(explode))
    envelopes, state, _ = await run(driver, builder=builder)
    done = next(e.payload for e in envelopes if e.type == "agent.tool.completed")
    assert done.success is False  # type: ignore[union-attr]
    assert "tool broke: r" in (done.error or "")  # type: ignore[union-attr]
    final = envelopes[-1].payload
    assert final.status == "failed"  # type: ignore[union-attr]
    assert final.stop_reason == "error"  # type: ignore[union-attr]
    assert final.error_message  # type: ignore[union-attr]
    assert state.status.value == "failed"


async def test_a_blocked_tool_call_is_reported_as_started_and_failed() -> None:
    def block(state: AgentState) -> AgentState:
        return state.with_tool_call_blocked("not on weekends")

    builder = AgentBuilder().with_tools(*demo_tools()).with_hook(HookPoint.BEFORE_TOOL_USE, block)
    envelopes, _, _ = await run(demo_driver(QUESTION), builder=builder)
    started = next(e.payload for e in envelopes if e.type == "agent.tool.started")
    done = next(e.payload for e in envelopes if e.type == "agent.tool.completed")
    assert started.tool_call_id == done.tool_call_id == "call_weather_1"  # type: ignore[union-attr]
    assert done.success is False  # type: ignore[union-attr]
    assert done.error == "blocked: not on weekends"  # type: ignore[union-attr]


async def test_the_final_state_is_stored_before_the_final_status() -> None:
    order: list[str] = []
    publisher = RecordingPublisher()

    async def store(state: AgentState) -> str:
        order.append(f"stored {state.status.value} after {len(publisher.records)} envelopes")
        return "/api/sessions/s-1/state"

    envelopes, _, _ = await run(demo_driver(QUESTION), final_state=store, publisher=publisher)
    assert order == [f"stored completed after {len(DEMO_TYPES) - 1} envelopes"]
    assert envelopes[-1].payload.state_url == "/api/sessions/s-1/state"  # type: ignore[union-attr]


async def test_a_failing_state_store_still_ends_the_stream() -> None:
    async def broken(state: AgentState) -> str:
        raise OSError("disk full")

    envelopes, _, adapter = await run(demo_driver(QUESTION), final_state=broken)
    assert envelopes[-1].payload.status == "completed"  # type: ignore[union-attr]
    assert envelopes[-1].payload.state_url is None  # type: ignore[union-attr]
    assert adapter.failures == 1


class FlakyPublisher:
    """Refuses every other publication."""

    def __init__(self) -> None:
        self.stats = PublisherStats()
        self.calls = 0

    async def broadcast(self, channel: str, envelope: Envelope) -> None:
        self.calls += 1
        if self.calls % 2:
            raise ConnectionError("audience unreachable")

    async def aclose(self) -> None:
        return None


async def test_an_unreachable_audience_never_breaks_the_run() -> None:
    publisher = FlakyPublisher()
    _, state, adapter = await run(demo_driver(QUESTION), publisher=publisher)
    assert state.status.value == "completed"
    assert adapter.failures == (publisher.calls + 1) // 2


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="summary_length"):
        AdapterOptions(summary_length=2)


async def test_timer_tasks_do_not_leak() -> None:
    await run(PacedDriver(demo_driver(QUESTION), 0.001))
    leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert leftover == []


async def test_a_crashing_run_still_ends_with_a_failed_status() -> None:
    """A run that dies outside the agent loop (here: its stored conversation cannot be
    read) must not leave its followers waiting for a final status."""
    from agent_core.app.runs import RunManager, RunRequest

    class NoStore:
        async def save(self, channel: str, snapshot: bytes) -> None:
            return None

    async def unreadable(channel: str) -> bytes:
        return b"{not json"

    publisher = RecordingPublisher()
    manager = RunManager(
        publisher=publisher,
        state_store=NoStore(),
        driver_factory=demo_driver,
        load_snapshot=unreadable,
    )
    handle = await manager.start(RunRequest(input="hi"))
    assert await manager.wait(handle.session_id) is None
    final = publisher.envelopes()[-1]
    assert final.type == "agent.status"
    assert final.payload.status == "failed"  # type: ignore[union-attr]
    assert "the run crashed" in (final.payload.error_message or "")  # type: ignore[union-attr]


# -- a run's end is always published (issue 44) --------------------------------------


async def test_a_final_status_json_cannot_carry_is_published_failed_saying_why() -> None:
    """orjson writes no text that is not UTF-8: a model's lone surrogate in the last
    answer made the final status unpublishable, and followers never saw the end."""
    envelopes, _, _ = await run(ScriptedDriver([ScriptedResponse(text="a \ud800 b")]))
    assert envelopes[-1].type == "agent.status"
    final = envelopes[-1].payload
    assert final.status == "failed"  # type: ignore[union-attr]
    assert final.stop_reason == "error"  # type: ignore[union-attr]
    assert "payload.last_response" in final.error_message  # type: ignore[union-attr]
    assert final.last_response == "a \ufffd b"  # type: ignore[union-attr]
    orjson.loads(envelopes[-1].to_json())  # it can be published


def test_a_publishable_final_status_is_left_as_it_is() -> None:
    from agent_core.adapters.broadcasting import publishable_end
    from broadcaster import envelope as env

    status = env.AgentStatus(
        session_id="s", execution_id="x", payload=env.StatusPayload(status="completed")
    )
    assert publishable_end(status) is status


async def test_a_refused_final_state_ends_the_run_failed_with_where_it_stands() -> None:
    from agent_core.adapters.broadcasting import FinalStateRefused

    async def refusing(state: AgentState) -> str:
        raise FinalStateRefused("the run's final state held what JSON cannot carry", "/there")

    envelopes, _, adapter = await run(demo_driver(QUESTION), final_state=refusing)
    final = envelopes[-1].payload
    assert (final.status, final.stop_reason) == ("failed", "error")  # type: ignore[union-attr]
    assert final.error_message == "the run's final state held what JSON cannot carry"  # type: ignore[union-attr]
    assert final.state_url == "/there"  # type: ignore[union-attr]
    assert adapter.failures == 1


def test_a_final_state_json_cannot_carry_is_stored_failed_saying_where() -> None:
    from agent_core.adapters.broadcasting import encode_final_state

    good = {"status": "completed", "n": 3}
    assert encode_final_state(good) == (orjson.dumps(good), None)
    data, reason = encode_final_state(
        {"status": "completed", "metadata": {"n": 10**20}, "messages": [{"content": "\udfff"}]}
    )
    assert reason is not None
    assert "metadata.n" in reason
    assert "messages[0].content" in reason
    stored = orjson.loads(data)
    assert stored["status"] == "failed"
    assert stored["error_message"] == reason
    assert stored["metadata"]["n"] == 2**53 - 1


def test_summaries_of_values_json_cannot_carry_do_not_fail() -> None:
    assert summarize_args({"n": 10**20}) == "n: 9007199254740991"
    assert summarize_result({"n": -(10**30)}) == '{"n":-9007199254740991}'
