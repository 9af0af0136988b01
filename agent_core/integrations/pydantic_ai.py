"""pydantic-ai on the wire: run a ``pydantic_ai.Agent`` and publish the run as envelopes.

``pip install agent-broadcaster[pydantic-ai]``. The run goes through ``Agent.iter()``:
each model request node is a step (``agent.step.started``; its streamed text parts
become ``agent.stream.chunk``), the call-tools node that follows it publishes the tool
calls with pydantic-ai's own ``tool_call_id`` and arguments (``FunctionToolCallEvent``,
``FunctionToolResultEvent``) and closes the step with the response's usage and finish
reason; the end node's output is the final ``agent.status``::

    agent = Agent("openai:gpt-4o", tools=[get_weather])
    publisher = PusherHTTPPublisher("http://localhost:8000", "1", "agent-key", "agent-secret")
    result = await broadcast_pydantic_ai(agent, "Weather in Oslo?", publisher, "s-1")
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agent_core.integrations._extras import missing_extra

try:
    from pydantic_ai import Agent
    from pydantic_ai.exceptions import UsageLimitExceeded
    from pydantic_ai.messages import (
        FunctionToolCallEvent,
        FunctionToolResultEvent,
        ModelResponse,
        PartDeltaEvent,
        PartStartEvent,
        TextPart,
        TextPartDelta,
    )
    from pydantic_ai.run import AgentRunResult
    from pydantic_ai.usage import UsageLimits
except ModuleNotFoundError as exc:  # the extra is not installed
    raise missing_extra(exc, "pydantic-ai", __name__) from None

from agent_core.adapters.broadcasting import AdapterOptions
from agent_core.integrations._base import FrameworkRun
from broadcaster.publishers import Publisher, StateStore

__all__ = ["broadcast_pydantic_ai"]

FRAMEWORK = "pydantic-ai"


async def broadcast_pydantic_ai(
    agent: Agent[Any, Any],
    prompt: str,
    publisher: Publisher,
    session_id: str,
    *,
    execution_id: str | None = None,
    options: AdapterOptions | None = None,
    state_store: StateStore | None = None,
    stream: bool = True,
    channel: str | None = None,
    **run_kwargs: Any,
) -> AgentRunResult[Any]:
    """Run ``agent`` on ``prompt`` and publish the run on ``agent.<session_id>``.

    Args:
        agent: the pydantic-ai agent.
        prompt: the user prompt.
        publisher: where envelopes go.
        session_id: the session (channel ``agent.<session_id>``).
        execution_id: the envelopes' execution id (default: a new one).
        options: what to publish (see :class:`AdapterOptions`).
        state_store: stores the final snapshot for ``GET /api/sessions/{id}/state``.
        stream: stream model responses (text as it comes); False for models that
            cannot stream (a ``FunctionModel`` without ``stream_function``): the text
            is then published whole when the response arrives.
        channel: publish here instead of ``agent.<session_id>``.
        run_kwargs: passed to ``Agent.iter`` (deps, message_history, model, ...).

    Returns:
        pydantic-ai's run result.

    Raises:
        Whatever the run raises, after the final status was published and the
        publisher flushed: ``failed`` / ``error``, except for ``UsageLimitExceeded``,
        which ends the run as ``agent_core``'s matching limit does (``completed`` /
        ``steps_limit`` for ``request_limit``, ``token_limit`` for a tokens or cost
        limit). A tool that raised is reported ``success: false`` with the error.
    """
    run = FrameworkRun(
        publisher,
        session_id,
        execution_id,
        framework=FRAMEWORK,
        agent_id=agent.name or "agent",
        options=options,
        state_store=state_store,
        channel=channel,
    )
    await run.started(prompt)
    limits = run_kwargs.get("usage_limits") or UsageLimits()  # pydantic-ai's default too
    try:
        async with agent.iter(prompt, **run_kwargs) as agent_run:
            async for node in agent_run:
                if Agent.is_model_request_node(node):
                    # pydantic-ai's own check, before the step: a limit that refuses the
                    # request starts no step, as agent_core's step limit starts none.
                    limits.check_before_request(agent_run.usage)
                    await run.step_started(
                        tools=_tool_names(agent),
                        message_count=len(agent_run.ctx.state.message_history),
                    )
                    if stream:
                        async with node.stream(agent_run.ctx) as events:
                            async for event in events:
                                await _on_model_event(run, event)
                elif Agent.is_call_tools_node(node):
                    response = node.model_response
                    if not stream:
                        await _whole_text(run, response)
                    async with node.stream(agent_run.ctx) as events:
                        async for event in events:
                            await _on_tool_event(run, event)
                    await _step_done(run, response)
        result = agent_run.result
        assert result is not None, "the run ended at its end node"
    except UsageLimitExceeded as exc:
        await run.limited(f"{type(exc).__name__}: {exc}", stop_reason=_limit(exc))
        raise
    except BaseException as exc:
        await run.failed(f"{type(exc).__name__}: {exc}")
        raise
    await run.completed(result.output)
    return result


def _limit(exc: UsageLimitExceeded) -> str:
    """The ``agent_core`` limit matching pydantic-ai's ``UsageLimits`` one: the request
    limit is the step limit; a tokens (or cost) limit, the token budget."""
    return "steps_limit" if "request_limit" in str(exc) else "token_limit"


async def _on_model_event(run: FrameworkRun, event: Any) -> None:
    if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
        await run.text(event.part.content)
    elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
        await run.text(event.delta.content_delta)


async def _on_tool_event(run: FrameworkRun, event: Any) -> None:
    if isinstance(event, FunctionToolCallEvent):
        part = event.part
        await run.tool_started(part.tool_call_id, part.tool_name, part.args_as_dict())
    elif isinstance(event, FunctionToolResultEvent):
        done = event.part
        failed = done.outcome in ("failed", "denied", "interrupted", "retried")
        error = str(done.content) if failed else None
        await run.tool_completed(done.tool_call_id, done.content, error=error, name=done.tool_name)


async def _whole_text(run: FrameworkRun, response: ModelResponse) -> None:
    for part in response.parts:
        if isinstance(part, TextPart):
            await run.text(part.content)


async def _step_done(run: FrameworkRun, response: ModelResponse) -> None:
    reason = response.finish_reason
    await run.step_completed(
        input_tokens=response.usage.input_tokens,
        output_tokens=response.usage.output_tokens,
        finish_reason="tool_calls" if reason == "tool_call" else reason,
    )


def _tool_names(agent: Agent[Any, Any]) -> Sequence[str]:
    """The agent's own function tools (toolsets given per run are not listed)."""
    toolset = getattr(agent, "_function_toolset", None)
    return sorted(getattr(toolset, "tools", {}) or {})
