"""Docs that run: every fenced ``python`` block of README.md and docs/*.md is executed
against a real server, as a reader would run it, with only the model replaced by the
framework's test double (and the OTLP exporter by an in-memory one) and the URL by the
test server's. What an example promises is checked: the final ``agent.status`` reaches a
real subscriber, and the session's state is served for the page to say "In sync".

A block that cannot run is listed in :data:`NOT_RUN` with the reason; a block neither
run nor listed fails :func:`test_every_python_example_is_run_or_says_why_not`.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from agents import set_tracing_disabled
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from broadcaster.envelope import channel_for
from tests.support.graphs import weather_model
from tests.support.live import Client, LiveServer, StartServer
from tests.support.openai_agents_model import ScriptedModel, call, text

ROOT = Path(__file__).resolve().parents[3]
DOCUMENTS = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in ROOT.glob("docs/*.md"))]
DOC_URL = "http://127.0.0.1:8080"
FENCE = re.compile(r"^```python[^\n]*\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Example:
    """How one block is run: ``replace`` pairs (each must occur in the block), names
    the block may use (its test doubles), and the session whose run it publishes."""

    replace: tuple[tuple[str, str], ...] = ()
    names: Callable[[], dict[str, Any]] = dict
    session: str | None = "weather-1"
    demo: bool = False  # the block starts a run on the demo server (`POST /run`)


def _pydantic_ai() -> Example:
    return Example(
        replace=(('Agent("openai:gpt-4o-mini"', 'Agent(TestModel(call_tools=["get_weather"])'),),
        names=lambda: {"TestModel": __import__("pydantic_ai.models.test").models.test.TestModel},
    )


def _openai_agents() -> Example:
    def names() -> dict[str, Any]:
        set_tracing_disabled(True)  # no trace export to OpenAI from a test
        script = [[call("get_weather", '{"city": "Oslo"}', "call_d1")], [text("Sunny in Oslo.")]]
        return {"FAKE_MODEL": ScriptedModel(script)}

    return Example(
        replace=(("tools=[get_weather])", "tools=[get_weather], model=FAKE_MODEL)"),), names=names
    )


def _langgraph() -> Example:
    return Example(
        replace=(('create_react_agent("openai:gpt-4o-mini"', "create_react_agent(FAKE_MODEL"),),
        names=lambda: {"FAKE_MODEL": weather_model("Sunny in Oslo.")},
    )


def _otel() -> Example:
    return Example(
        replace=(('otlp_tracer_provider("my-agents")', "MEMORY_PROVIDER"),), session=None
    )


RUN: dict[str, Example] = {
    "README.md#1": _pydantic_ai(),
    "README.md#2": _openai_agents(),
    "README.md#3": _langgraph(),
    "README.md#4": Example(session=None, demo=True),  # the client kit follows a demo run
    "docs/agent_core.md#1": Example(session=None),  # a scripted driver: no model to replace
    "docs/integrations.md#1": _pydantic_ai(),
    "docs/integrations.md#2": _openai_agents(),
    "docs/integrations.md#3": _langgraph(),
    "docs/integrations.md#4": _otel(),
}
NOT_RUN: dict[str, str] = {}
"""Blocks that cannot run here, each with the reason (none at present)."""


def python_blocks() -> dict[str, str]:
    """Every fenced python block, named ``<file>#<n>`` (n counts the file's blocks)."""
    blocks: dict[str, str] = {}
    for name in DOCUMENTS:
        found = FENCE.findall((ROOT / name).read_text(encoding="utf-8"))
        for index, source in enumerate(found, start=1):
            blocks[f"{name}#{index}"] = source
    return blocks


BLOCKS = python_blocks()


def test_every_python_example_is_run_or_says_why_not() -> None:
    assert BLOCKS, "the README has python examples"
    unlisted = sorted(set(BLOCKS) - set(RUN) - set(NOT_RUN))
    assert not unlisted, f"python examples neither run nor listed in NOT_RUN: {unlisted}"
    gone = sorted((set(RUN) | set(NOT_RUN)) - set(BLOCKS))
    assert not gone, f"listed examples that no longer exist: {gone}"
    assert not set(RUN) & set(NOT_RUN)


def prepared(name: str, url: str) -> str:
    """The block as run: the URL and the model replaced, nothing else."""
    source = BLOCKS[name]
    for old, new in RUN[name].replace:
        assert old in source, f"{name} no longer has {old!r} (update RUN)"
        source = source.replace(old, new)
    return source.replace(DOC_URL, url)


def execute(source: str, filename: str, names: dict[str, Any]) -> dict[str, Any]:
    """Run ``source`` as a script (a top-level ``await`` as in a notebook); its globals."""
    code = compile(source, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    namespace: dict[str, Any] = {"__name__": "__main__", **names}
    with warnings.catch_warnings():
        # langgraph 1.x deprecates create_react_agent (moved to the langchain package,
        # not installed here); the README's example is still what LangGraph users know.
        warnings.filterwarnings("ignore", "create_react_agent has been moved")
        if code.co_flags & inspect.CO_COROUTINE:
            asyncio.run(eval(code, namespace))
        else:
            exec(code, namespace)
    return namespace


async def final_status(watcher: Client, within: float = 10) -> dict[str, Any]:
    while True:
        message = await watcher.recv(within)
        data = message.get("data")
        if message["event"] == "agent.status" and data["payload"]["status"] != "in_progress":
            return dict(data["payload"])


@pytest.mark.parametrize("name", sorted(RUN))
async def test_a_documented_example_runs_and_does_what_it_says(
    name: str, start_server: StartServer, clients: Callable[..., Awaitable[Client]]
) -> None:
    example = RUN[name]
    live = await start_server(demo=example.demo)
    names = example.names()
    printed: list[tuple[Any, ...]] = []
    names["print"] = lambda *args: printed.append(args)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    names["MEMORY_PROVIDER"] = provider
    watcher = None
    if example.session is not None:
        watcher = await clients(live.app_url())
        await watcher.subscribe(channel_for(example.session))
    source = prepared(name, live.url)
    namespace = await asyncio.to_thread(execute, source, name, names)
    if name == "docs/agent_core.md#1":
        state = namespace["state"]
        assert (state.status.value, state.stop_reason()) == ("completed", "completed")
        return
    if name == "README.md#4":
        # It printed the run's final status and its last step's text, followed live.
        [(status, last_text)] = printed
        assert status == "completed"
        assert isinstance(last_text, str)
        assert last_text
        return
    if name == "docs/integrations.md#4":
        await _traces_and_forwards(namespace, live, clients, exporter)
        return
    assert watcher is not None
    assert example.session is not None
    final = await final_status(watcher)
    await _in_sync(live, example.session, final)


async def _in_sync(live: LiveServer, session: str, final: dict[str, Any]) -> None:
    """The run ended completed, and its final state is served where the page reads it."""
    assert (final["status"], final["stop_reason"]) == ("completed", "completed")
    assert final["state_url"] == f"/api/sessions/{session}/state"
    async with httpx.AsyncClient(base_url=live.url) as http:
        answer = await http.get(final["state_url"])
    assert answer.status_code == 200, answer.text
    state = answer.json()
    assert (state["status"], state["step_count"]) == ("completed", final["step_count"])
    assert state["last_continuation"]["stop_reason"] == "completed"


async def _traces_and_forwards(
    namespace: dict[str, Any],
    live: LiveServer,
    clients: Callable[..., Awaitable[Client]],
    exporter: InMemorySpanExporter,
) -> None:
    """The OTel block's publisher, handed to a helper as it says, publishes and traces."""
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    from agent_core.integrations.pydantic_ai import broadcast_pydantic_ai

    watcher = await clients(live.app_url())
    await watcher.subscribe(channel_for("otel-1"))
    async with namespace["publisher"] as publisher:
        await broadcast_pydantic_ai(Agent(TestModel(), name="weather"), "Hi", publisher, "otel-1")
    final = await final_status(watcher)
    await _in_sync(live, "otel-1", final)
    names = [span.name for span in exporter.get_finished_spans()]
    assert "invoke_agent weather" in names


async def test_the_short_form_of_issue_28_loses_no_event(
    start_server: StartServer, clients: Callable[..., Awaitable[Client]]
) -> None:
    """The README's former pydantic-ai example, publisher never closed: ``asyncio.run``
    ending lost the final status. Now the helper flushes before it returns, and the
    publisher's connections close with the loop."""
    short = """
import asyncio
from pydantic_ai import Agent
from agent_core.integrations.pydantic_ai import broadcast_pydantic_ai
from broadcaster.publishers import PusherHTTPPublisher

agent = Agent(TestModel(), instructions="Answer briefly.")


@agent.tool_plain
def get_weather(city: str) -> str:
    return f"sunny in {city}"


publisher = PusherHTTPPublisher("http://127.0.0.1:8080", "1", "agent-key", "agent-secret")
asyncio.run(broadcast_pydantic_ai(agent, "Weather in Oslo?", publisher, "weather-1"))
"""
    from pydantic_ai.models.test import TestModel

    live = await start_server()
    watcher = await clients(live.app_url())
    await watcher.subscribe(channel_for("weather-1"))
    source = short.replace(DOC_URL, live.url)
    namespace = await asyncio.to_thread(execute, source, "short", {"TestModel": TestModel})
    final = await final_status(watcher)
    await _in_sync(live, "weather-1", final)
    assert namespace["publisher"].stats.dropped == 0
    assert namespace["publisher"]._client.is_closed, "closed with the loop that used it"
