"""The OpenAI Agents SDK on the wire: run an ``agents.Agent`` and publish the run as
envelopes.

``pip install agent-broadcaster[openai-agents]``. The run goes through
``Runner.run_streamed``; its stream events are mapped in order:

- ``response.created`` (a model call begins): ``agent.step.started``, whose ``actor``
  is the agent answering (after a handoff, the agent handed to);
- ``response.output_text.delta``: ``agent.stream.chunk`` (coalesced);
- ``tool_called`` / ``tool_output`` run items: ``agent.tool.started`` /
  ``agent.tool.completed`` with the model's ``call_id`` and parsed arguments. A tool
  that raised is ``success: false`` with its error: the SDK hands the model a text
  instead, so the run's ``RunConfig.tool_error_formatter`` is wrapped to note which call
  failed and why (a formatter of your own still decides the model's text); a handoff
  (``handoff_requested`` / ``handoff_occured``) is a tool call too, whose
  result names the agent handed to;
- ``response.completed``: the step's usage, published with ``agent.step.completed``
  once the step's tools ran (when the next model call starts, or at the end);
- the run's ``final_output``: the final ``agent.status``::

    agent = Agent(name="Assistant", tools=[get_weather], handoffs=[billing])
    publisher = PusherHTTPPublisher("http://localhost:8000", "1", "agent-key", "agent-secret")
    result = await broadcast_openai_agents(agent, "Weather in Oslo?", publisher, "s-1")
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import orjson

from agent_core.integrations._extras import missing_extra

try:
    from agents import (
        Agent,
        AgentUpdatedStreamEvent,
        RawResponsesStreamEvent,
        RunConfig,
        RunItemStreamEvent,
        Runner,
        RunResultStreaming,
    )
    from agents.exceptions import MaxTurnsExceeded
    from agents.run_config import ToolErrorFormatterArgs
except ModuleNotFoundError as exc:  # the extra is not installed
    raise missing_extra(exc, "openai-agents", __name__) from None

from agent_core.adapters.broadcasting import AdapterOptions
from agent_core.integrations._base import FrameworkRun
from broadcaster.publishers import Publisher, StateStore

__all__ = ["broadcast_openai_agents"]

FRAMEWORK = "openai-agents"


class _Turns:
    """The state of one streamed run: who acts, and the open step's usage."""

    def __init__(self, run: FrameworkRun, agent: Agent[Any]) -> None:
        self.run = run
        self.agent = agent
        self.errors: dict[str, str] = {}  # call id -> why the tool failed
        self.usage: tuple[int, int] = (0, 0)
        self.asked_tools = False
        self.open = False

    async def on_event(self, event: Any) -> None:
        if isinstance(event, AgentUpdatedStreamEvent):
            self.agent = event.new_agent
        elif isinstance(event, RawResponsesStreamEvent):
            await self._raw(event.data)
        elif isinstance(event, RunItemStreamEvent):
            await self._item(event.name, event.item)

    async def _raw(self, data: Any) -> None:
        kind = getattr(data, "type", "")
        if kind == "response.created":
            await self.close_step()
            self.open = True
            await self.run.step_started(actor=self.agent.name, tools=await self._tool_names())
        elif kind == "response.output_text.delta":
            await self.run.text(data.delta)
        elif kind == "response.completed":
            usage = data.response.usage
            if usage is not None:
                self.usage = (usage.input_tokens, usage.output_tokens)
            outputs = data.response.output or []
            self.asked_tools = any(getattr(o, "type", "") == "function_call" for o in outputs)

    async def _item(self, name: str, item: Any) -> None:
        raw = item.raw_item
        if name in ("tool_called", "handoff_requested"):
            call_id = _field(raw, "call_id") or _field(raw, "id") or "call"
            tool = _field(raw, "name")
            await self.run.tool_started(call_id, tool or "tool", _arguments(raw))
        elif name == "tool_output":
            call_id = _field(raw, "call_id")
            error = self.errors.pop(call_id, None)
            await self.run.tool_completed(call_id, item.output, error=error)
        elif name == "handoff_occured":
            target = item.target_agent.name
            await self.run.tool_completed(_field(raw, "call_id"), f"handed off to {target}")

    async def close_step(self) -> None:
        if not self.open:
            return
        self.open = False
        prompt, completion = self.usage
        self.usage = (0, 0)
        reason = "tool_calls" if self.asked_tools else "stop"
        await self.run.step_completed(
            input_tokens=prompt, output_tokens=completion, finish_reason=reason
        )

    def config(self, given: RunConfig | None) -> RunConfig:
        """``given`` (or the default run config) with a tool error formatter that notes
        each failed call, then defers to ``given``'s own formatter."""
        config = given or RunConfig()
        theirs = config.tool_error_formatter

        async def noted(args: ToolErrorFormatterArgs[Any]) -> str | None:
            failure = args.error
            if failure is not None:
                self.errors[args.call_id] = f"{type(failure).__name__}: {failure}"
            else:
                self.errors[args.call_id] = args.default_message
            if theirs is None:
                return None
            said = theirs(args)
            return await said if inspect.isawaitable(said) else said

        return dataclasses.replace(config, tool_error_formatter=noted)

    async def _tool_names(self) -> list[str]:
        names = [getattr(t, "name", "") for t in self.agent.tools]
        names += [
            getattr(h, "tool_name", "") or getattr(h, "name", "") for h in self.agent.handoffs
        ]
        return [n for n in names if n]


async def broadcast_openai_agents(
    agent: Agent[Any],
    input: str | list[Any],
    publisher: Publisher,
    session_id: str,
    *,
    execution_id: str | None = None,
    options: AdapterOptions | None = None,
    state_store: StateStore | None = None,
    channel: str | None = None,
    **run_kwargs: Any,
) -> RunResultStreaming:
    """Run ``agent`` on ``input`` with ``Runner.run_streamed`` and publish the run on
    ``agent.<session_id>``.

    Args:
        agent: the starting agent.
        input: the user input (text, or a list of Responses input items).
        publisher: where envelopes go.
        session_id: the session (channel ``agent.<session_id>``).
        execution_id: the envelopes' execution id (default: a new one).
        options: what to publish (see :class:`AdapterOptions`).
        state_store: stores the final snapshot for ``GET /api/sessions/{id}/state``.
        channel: publish here instead of ``agent.<session_id>``.
        run_kwargs: passed to ``Runner.run_streamed`` (context, max_turns, hooks, ...).

    Returns:
        the SDK's streamed run result, consumed (``final_output`` is set).

    Raises:
        Whatever the run raises, after the final status was published and the
        publisher flushed: ``failed`` / ``error``, except for ``MaxTurnsExceeded``,
        which ends the run as ``agent_core``'s step limit does (``completed`` /
        ``steps_limit``).
    """
    run = FrameworkRun(
        publisher,
        session_id,
        execution_id,
        framework=FRAMEWORK,
        agent_id=agent.name,
        options=options,
        state_store=state_store,
        channel=channel,
    )
    await run.started(input if isinstance(input, str) else None)
    turns = _Turns(run, agent)
    run_kwargs["run_config"] = turns.config(run_kwargs.get("run_config"))
    try:
        result = Runner.run_streamed(agent, input, **run_kwargs)
        async for event in result.stream_events():
            await turns.on_event(event)
        await turns.close_step()
    except MaxTurnsExceeded as exc:
        await run.limited(f"{type(exc).__name__}: {exc}", stop_reason="steps_limit")
        raise
    except BaseException as exc:
        await run.failed(f"{type(exc).__name__}: {exc}")
        raise
    await run.completed(result.final_output)
    return result


def _field(raw: Any, name: str) -> str:
    value = raw.get(name) if isinstance(raw, dict) else getattr(raw, name, None)
    return str(value) if value else ""


def _arguments(raw: Any) -> dict[str, Any]:
    text = _field(raw, "arguments")
    if not text:
        return {}
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {"arguments": text}
    return parsed if isinstance(parsed, dict) else {"arguments": parsed}
