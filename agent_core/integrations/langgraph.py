"""LangGraph on the wire: run a compiled graph and publish the run as envelopes.

``pip install agent-broadcaster[langgraph]``. The run goes through
``graph.astream_events(input, version="v2")``; its events are mapped in order:

- a graph node starting (``on_chain_start`` of the run whose name is its
  ``langgraph_node``): ``agent.step.started`` with the node's name as ``actor``; its
  end (``on_chain_end`` of the same run): ``agent.step.completed`` with the usage its
  chat models reported. A node whose model asked for tools keeps its step open for
  the node that runs them (the ``ToolNode``), so that step has the calls, as an
  ``agent_core`` step does;
- ``on_chat_model_stream``: ``agent.stream.chunk`` (coalesced);
- ``on_chat_model_end``: the message's ``usage_metadata`` and ``tool_calls``, whose
  ids and arguments the tool envelopes carry;
- ``on_tool_start`` / ``on_tool_end``: ``agent.tool.started`` /
  ``agent.tool.completed`` (the ``ToolMessage``'s ``tool_call_id``; an error status or
  ``on_tool_error`` is an unsuccessful call);
- the graph's end: the final ``agent.status`` whose response is the last AI message::

    graph = builder.compile()
    publisher = PusherHTTPPublisher("http://localhost:8000", "1", "agent-key", "agent-secret")
    final = await broadcast_langgraph(graph, {"messages": [("user", "Hi")]}, publisher, "s-1")
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from agent_core.integrations._extras import missing_extra

try:
    from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
    from langgraph.errors import GraphRecursionError
    from langgraph.graph.state import CompiledStateGraph
except ModuleNotFoundError as exc:  # the extra is not installed
    raise missing_extra(exc, "langgraph", __name__) from None

from agent_core.adapters.broadcasting import AdapterOptions
from agent_core.integrations._base import FrameworkRun
from broadcaster.publishers import Publisher, StateStore

__all__ = ["broadcast_langgraph"]

FRAMEWORK = "langgraph"


class _Graph:
    """The state of one graph run: the open node, its usage, the pending tool calls.

    A step is a node whose chat model answered, together with the tools that answer
    asked for: when a node ends having asked for tools, its step stays open, and the
    next node (LangGraph's ``ToolNode``, or any node that runs tools before calling a
    model) runs in it. So the step whose finish reason is ``tool_calls`` carries its
    calls, as an ``agent_core`` step does.
    """

    def __init__(self, run: FrameworkRun) -> None:
        self.run = run
        self.node_run: str | None = None
        self.node_name = ""
        self.usage = [0, 0]
        self.asked_tools = False
        self.awaiting = False  # the open step asked for tools that have not run yet
        self.absorbing = False  # the running node runs them, within the open step
        self.pending: dict[str, list[tuple[str, dict[str, Any]]]] = defaultdict(list)
        self.tool_runs: dict[str, tuple[str, str]] = {}
        self.output: Any = None

    async def on_event(self, event: dict[str, Any]) -> None:
        kind, run_id = event["event"], event["run_id"]
        metadata, data = event.get("metadata") or {}, event.get("data") or {}
        if kind == "on_chain_start" and self._is_node(event, metadata):
            await self._node_started(run_id, event["name"])
        elif kind == "on_chain_end" and run_id == self.node_run:
            await self._node_finished()
        elif kind == "on_chain_end" and not event.get("parent_ids"):
            self.output = data.get("output")
        elif kind == "on_chat_model_start":
            await self._model_started()
        elif kind == "on_chat_model_stream":
            await self.run.text(_text(data.get("chunk")))
        elif kind == "on_chat_model_end":
            await self._model_finished(data.get("output"))
        elif kind == "on_tool_start":
            await self._tool_started(run_id, event["name"], data.get("input"))
        elif kind in ("on_tool_end", "on_tool_error"):
            await self._tool_finished(run_id, event["name"], data, kind == "on_tool_error")

    def _is_node(self, event: dict[str, Any], metadata: dict[str, Any]) -> bool:
        return self.node_run is None and event["name"] == metadata.get("langgraph_node")

    async def _node_started(self, run_id: str, name: str) -> None:
        self.node_run, self.node_name = run_id, name
        if self.awaiting:
            self.absorbing = True
            return
        await self._open()

    async def _open(self) -> None:
        self.usage, self.asked_tools = [0, 0], False
        await self.run.step_started(actor=self.node_name)

    async def _model_started(self) -> None:
        # A model answers in this node while no tool runs: a step of its own from here
        # (a model that a running tool calls is part of that tool's call).
        if self.absorbing and not self.tool_runs:
            self.absorbing = False
            await self._close()
            await self._open()

    async def _node_finished(self) -> None:
        self.node_run = None
        if self.asked_tools and not self.absorbing:
            self.awaiting = True  # the step stays open for the tools it asked for
            return
        self.absorbing = False
        await self._close()

    async def _close(self) -> None:
        self.awaiting = False
        await self.run.step_completed(
            input_tokens=self.usage[0],
            output_tokens=self.usage[1],
            finish_reason="tool_calls" if self.asked_tools else None,
        )

    async def _model_finished(self, message: Any) -> None:
        if not isinstance(message, AIMessage):
            return
        usage = message.usage_metadata
        if usage is not None:
            self.usage[0] += int(usage.get("input_tokens", 0))
            self.usage[1] += int(usage.get("output_tokens", 0))
        for call in message.tool_calls:
            self.asked_tools = True
            call_id = call.get("id") or ""
            self.pending[call["name"]].append((call_id, dict(call["args"])))
            if call_id:
                await self.run.tool_requested(call_id, call["name"])

    async def _tool_started(self, run_id: str, name: str, given: Any) -> None:
        call_id, args = self.pending[name].pop(0) if self.pending[name] else ("", {})
        if not args and isinstance(given, dict):
            args = given
        call_id = call_id or run_id
        self.tool_runs[run_id] = (call_id, name)
        await self.run.tool_started(call_id, name, args)

    async def _tool_finished(self, run_id: str, name: str, data: dict[str, Any], err: bool) -> None:
        call_id, known = self.tool_runs.pop(run_id, (run_id, name))
        output = data.get("output")
        if err:
            failure = str(data.get("error") or "the tool failed")
            await self.run.tool_completed(call_id, None, error=failure, name=known)
            return
        result: Any = output
        error: str | None = None
        if isinstance(output, ToolMessage):
            result = output.content
            error = str(output.content) if output.status == "error" else None
        await self.run.tool_completed(call_id, result, error=error, name=known)


async def broadcast_langgraph(
    graph: CompiledStateGraph[Any, Any, Any, Any],
    input: Any,
    publisher: Publisher,
    session_id: str,
    *,
    execution_id: str | None = None,
    options: AdapterOptions | None = None,
    state_store: StateStore | None = None,
    channel: str | None = None,
    **stream_kwargs: Any,
) -> Any:
    """Run ``graph`` on ``input`` with ``astream_events`` (v2) and publish the run on
    ``agent.<session_id>``; graph nodes are steps (a node that runs the tools the
    previous node's model asked for is part of that node's step).

    Args:
        graph: the compiled graph.
        input: the graph's input (e.g. ``{"messages": [("user", "...")]}``).
        publisher: where envelopes go.
        session_id: the session (channel ``agent.<session_id>``).
        execution_id: the envelopes' execution id (default: a new one).
        options: what to publish (see :class:`AdapterOptions`).
        state_store: stores the final snapshot for ``GET /api/sessions/{id}/state``.
        channel: publish here instead of ``agent.<session_id>``.
        stream_kwargs: passed to ``astream_events`` (config, ...).

    Returns:
        the graph's final output (its state).

    Raises:
        Whatever the run raises, after the final status was published and the
        publisher flushed: ``failed`` / ``error``, except for ``GraphRecursionError``
        (the ``recursion_limit``), which ends the run as ``agent_core``'s step limit
        does (``completed`` / ``steps_limit``).
    """
    run = FrameworkRun(
        publisher,
        session_id,
        execution_id,
        framework=FRAMEWORK,
        agent_id=graph.get_name() or "graph",
        options=options,
        state_store=state_store,
        channel=channel,
    )
    await run.started(_prompt(input))
    state = _Graph(run)
    try:
        async for event in graph.astream_events(input, version="v2", **stream_kwargs):
            await state.on_event(dict(event))
    except GraphRecursionError as exc:
        await run.limited(f"{type(exc).__name__}: {exc}", stop_reason="steps_limit")
        raise
    except BaseException as exc:
        await run.failed(f"{type(exc).__name__}: {exc}")
        raise
    await run.completed(_answer(state.output))
    return state.output


def _text(chunk: Any) -> str:
    if not isinstance(chunk, BaseMessage):
        return ""
    content = chunk.content
    if isinstance(content, str):
        return content
    parts = [p.get("text", "") if isinstance(p, dict) else str(p) for p in content]
    return "".join(str(p) for p in parts)


def _messages(value: Any) -> list[Any]:
    messages = value.get("messages") if isinstance(value, dict) else None
    return list(messages) if isinstance(messages, list) else []


def _prompt(input: Any) -> str | None:
    for message in reversed(_messages(input)):
        if isinstance(message, tuple) and message and message[0] in ("user", "human"):
            return str(message[1])
        if isinstance(message, BaseMessage) and message.type == "human":
            return _text(message)
        if isinstance(message, dict) and message.get("role") in ("user", "human"):
            return str(message.get("content", ""))
    return None


def _answer(output: Any) -> Any:
    """The last AI message's text, else the output itself."""
    for message in reversed(_messages(output)):
        if isinstance(message, AIMessage):
            return _text(message)
    return output
