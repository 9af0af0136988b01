"""Turn-taking on the step-by-step base: the machinery Chat and Collaboration share.

In each step a selector chooses an *actor* (a chat participant, a collaborator), the
actor answers the conversation so far, and the answer is recorded as a
:class:`TurnStep`. Actors:

- :class:`ScriptedActor` plays scripted replies in order (offline demos, tests);
- :class:`CallableActor` asks a function (an external system, a human bridge);
- :class:`ModelActor` asks a model through a :class:`~agent_core.drivers.base.ModelDriver`,
  optionally with tools (it then runs the model/tool rounds inside its turn, and only
  its final answer joins the conversation).

Selectors: :class:`RoundRobinSelector` and :class:`ModelSelector` (the model names the
next actor; an unknown name, or a failing model, falls back to the first actor and the
fallback is recorded). A failed step is retried by the same actor.

Default criteria (:func:`turn_criteria`): finish reasons stop/length/content_filter end
the process, 16 steps, 4096 tokens, the error check retries a failed step twice
(``RetryLimit(2)`` stops the third failure in a row as ``retry_limit``, failed).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, Self, TypeVar, cast

from agent_core._time import Clock, utc_now
from agent_core.continuation import ContinuationCriteria
from agent_core.criteria import FinishReasonCheck, RetryLimit, StepsLimit, TokenUsageLimit
from agent_core.drivers.base import ModelDriver, ModelRequest, complete
from agent_core.error_policy import ErrorPolicy, ErrorPolicyCriterion
from agent_core.errors import AgentError
from agent_core.events import EventDispatcher
from agent_core.messages import FinishReason, Message, Role, ToolCall, Usage
from agent_core.orchestrators.orchestration_events import ActorSelected
from agent_core.orchestrators.process import ProcessState
from agent_core.orchestrators.stepbystep import (
    ProcessorLike,
    StepByStep,
    StepContext,
    infer,
    run_tool_calls,
)
from agent_core.steps import StepError, ToolExecution
from agent_core.tools import Tool, ToolRegistry

__all__ = [
    "ACTOR_KEY",
    "TURN_FINISH_REASONS",
    "TURN_MAX_RETRIES",
    "TURN_MAX_STEPS",
    "TURN_MAX_TOKENS",
    "Actor",
    "ActorReply",
    "ActorSelector",
    "CallableActor",
    "ModelActor",
    "ModelSelector",
    "RoundRobinSelector",
    "ScriptedActor",
    "Selection",
    "Turn",
    "TurnOrchestrator",
    "TurnStep",
    "turn_criteria",
]

TURN_MAX_STEPS = 16
TURN_MAX_TOKENS = 4096
TURN_MAX_RETRIES = 2
TURN_FINISH_REASONS = (FinishReason.STOP, FinishReason.LENGTH, FinishReason.CONTENT_FILTER)
ACTOR_KEY = "actor"
"""Message metadata key naming the actor who wrote a message."""

StateT = TypeVar("StateT", bound="ProcessState[Any]")
StepT = TypeVar("StepT", bound="TurnStep")


# --- steps ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ActorReply:
    """What an actor answers in its turn."""

    content: str
    finish_reason: FinishReason | None = None
    usage: Usage = field(default_factory=Usage)
    tool_executions: tuple[ToolExecution, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TurnStep:
    """One actor's turn: what it said, its usage, tools it ran inside the turn, and
    errors (a turn that raised).

    ``messages`` are what the turn adds to the conversation: one message by the actor
    (``metadata.actor`` names it), none for a failed turn.
    """

    id: str
    actor: str
    content: str = ""
    role: Role = Role.ASSISTANT
    finish_reason: FinishReason | None = None
    usage: Usage = field(default_factory=Usage)
    errors: tuple[StepError, ...] = ()
    tool_executions: tuple[ToolExecution, ...] = ()
    messages: tuple[Message, ...] = ()
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_reply(cls, step_id: str, actor: str, role: Role, reply: ActorReply) -> Self:
        message = Message(role=role, content=reply.content, metadata={ACTOR_KEY: actor})
        return cls(
            id=step_id,
            actor=actor,
            content=reply.content,
            role=role,
            finish_reason=reply.finish_reason,
            usage=reply.usage,
            tool_executions=reply.tool_executions,
            messages=(message,),
            metadata=dict(reply.metadata),
        )

    @classmethod
    def failure(cls, step_id: str, actor: str, error: AgentError) -> Self:
        return cls(
            id=step_id,
            actor=actor,
            errors=(StepError.from_error(error),),
            finish_reason=FinishReason.ERROR,
        )

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The tool calls run inside the turn."""
        return tuple(e.tool_call for e in self.tool_executions)

    def has_tool_calls(self) -> bool:
        return bool(self.tool_executions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "actor": self.actor,
            "content": self.content,
            "role": self.role.value,
            "finish_reason": None if self.finish_reason is None else self.finish_reason.value,
            "usage": self.usage.model_dump(mode="json"),
            "errors": [e.to_dict() for e in self.errors],
            "tool_executions": [e.to_dict() for e in self.tool_executions],
            "messages": [m.model_dump(mode="json") for m in self.messages],
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Rebuild a step from :meth:`to_dict` output."""
        return cls(**cls.fields_from_dict(data))

    @classmethod
    def fields_from_dict(cls, data: Mapping[str, Any]) -> dict[str, Any]:
        finish = data.get("finish_reason")
        return {
            "id": str(data["id"]),
            "actor": str(data["actor"]),
            "content": str(data.get("content", "")),
            "role": Role(data.get("role", Role.ASSISTANT)),
            "finish_reason": None if finish is None else FinishReason(finish),
            "usage": Usage.model_validate(data.get("usage") or {}),
            "errors": tuple(StepError.from_dict(e) for e in data.get("errors", ())),
            "tool_executions": tuple(
                ToolExecution.from_dict(e) for e in data.get("tool_executions", ())
            ),
            "messages": tuple(Message.model_validate(m) for m in data.get("messages", ())),
            "metadata": dict(data.get("metadata") or {}),
        }


# --- actors --------------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """What an actor sees: its name, the conversation, the step, the event link."""

    actor: str
    messages: tuple[Message, ...]
    step_number: int
    context: StepContext
    metadata: Mapping[str, Any] = field(default_factory=dict)


class Actor(Protocol):
    """Takes turns: a chat participant or a collaborator."""

    @property
    def name(self) -> str: ...

    @property
    def role(self) -> Role:
        """The role of the actor's messages (assistant, or user for a human)."""
        ...

    @property
    def description(self) -> str: ...

    async def act(self, turn: Turn) -> ActorReply: ...


def _check_name(name: str) -> str:
    if not name or not name.strip():
        raise ValueError("an actor needs a non-empty name")
    return name


def _as_reply(value: Any, who: str) -> ActorReply:
    if isinstance(value, ActorReply):
        return value
    if isinstance(value, str):
        return ActorReply(content=value)
    if isinstance(value, Message):
        return ActorReply(content=value.content)
    raise TypeError(f"{who} must answer a str, Message or ActorReply, got {type(value).__name__}")


class ScriptedActor:
    """Plays scripted replies in order (named as such: nothing is inferred).

    Raises (from :meth:`act`):
        agent_core.errors.AgentError: every reply was played.
    """

    def __init__(
        self,
        name: str,
        replies: Iterable[str | ActorReply],
        *,
        role: Role = Role.ASSISTANT,
        description: str = "",
    ) -> None:
        self.name = _check_name(name)
        self.role = role
        self.description = description
        self.replies = tuple(_as_reply(r, f"scripted actor {name!r}") for r in replies)
        self.played = 0

    async def act(self, turn: Turn) -> ActorReply:
        if self.played >= len(self.replies):
            raise AgentError(
                f"scripted actor {self.name!r} has no replies left: all {len(self.replies)} "
                "were played; script more replies for further turns"
            )
        reply = self.replies[self.played]
        self.played += 1
        return reply


ActorFunction = Callable[[Turn], Any]
"""``(turn) -> str | Message | ActorReply`` or an awaitable of one."""


class CallableActor:
    """An external actor: a sync or async function of the turn."""

    def __init__(
        self,
        name: str,
        function: ActorFunction,
        *,
        role: Role = Role.ASSISTANT,
        description: str = "",
    ) -> None:
        self.name = _check_name(name)
        self.role = role
        self.description = description
        self.function = function

    async def act(self, turn: Turn) -> ActorReply:
        result = self.function(turn)
        if inspect.isawaitable(result):
            result = await result
        return _as_reply(result, f"actor {self.name!r}")


def perspective(messages: Iterable[Message], me: str | None) -> tuple[Message, ...]:
    """The conversation as ``me`` sees it: its own messages as assistant, everyone
    else's as user messages prefixed with their name (``None``: an observer)."""
    seen: list[Message] = []
    for message in messages:
        author = message.metadata.get(ACTOR_KEY)
        if message.role is Role.TOOL or (message.tool_calls and author != me):
            continue
        if author is None or message.role is Role.SYSTEM:
            seen.append(message)
        elif author == me:
            seen.append(Message.assistant(message.content))
        else:
            seen.append(Message.user(f"{author}: {message.content}"))
    return tuple(seen)


class ModelActor:
    """An actor backed by a model, optionally with tools.

    With tools it runs up to ``max_tool_rounds`` model/tool rounds inside its turn
    (tool calls are reported as tool events of the step); the last model answer is the
    turn's reply and its usage is the sum of all rounds.

    Args:
        name: the actor's name.
        driver: the model.
        tools: tools it may call.
        system_prompt: sent first (default: "You are {name}.").
        description: what it is good at (shown to a model selector).
        max_tool_rounds: tool rounds allowed in one turn.
        request_options: model request fields (``model``, ``temperature``, ...).
    """

    def __init__(
        self,
        name: str,
        driver: ModelDriver,
        *,
        tools: Iterable[Tool | Callable[..., Any]] = (),
        system_prompt: str | None = None,
        description: str = "",
        max_tool_rounds: int = 4,
        request_options: Mapping[str, Any] | None = None,
    ) -> None:
        if max_tool_rounds < 0:
            raise ValueError(f"max_tool_rounds must be 0 or more, got {max_tool_rounds}")
        self.name = _check_name(name)
        self.role = Role.ASSISTANT
        self.description = description
        self.driver = driver
        self.tools = tools if isinstance(tools, ToolRegistry) else ToolRegistry(tools)
        self.system_prompt = system_prompt or f"You are {name}."
        self.max_tool_rounds = max_tool_rounds
        self.request_options = dict(request_options or {})

    def _request(self, messages: Sequence[Message], with_tools: bool) -> ModelRequest:
        tools = self.tools.schemas() if with_tools else ()
        return ModelRequest(
            messages=(Message.system(self.system_prompt), *messages),
            tools=tools,
            **self.request_options,
        )

    async def act(self, turn: Turn) -> ActorReply:
        messages = list(perspective(turn.messages, self.name))
        usage, executions = Usage(), []
        for round_number in range(self.max_tool_rounds + 1):
            with_tools = bool(len(self.tools)) and round_number < self.max_tool_rounds
            response = await infer(self.driver, self._request(messages, with_tools), turn.context)
            usage = usage + response.usage
            if not response.tool_calls:
                break
            ran = await run_tool_calls(self.tools, response.tool_calls, turn.context)
            executions.extend(ran)
            messages += [response.message(), *(e.message() for e in ran)]
        return ActorReply(
            content=response.content,
            finish_reason=response.finish_reason,
            usage=usage,
            tool_executions=tuple(executions),
        )


# --- selectors -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Selection:
    """A selector's choice: the actor, why, whether it was a fallback, and the tokens
    choosing cost (counted in the step's usage)."""

    actor: str
    reason: str
    fallback: bool = False
    usage: Usage = field(default_factory=Usage)


class ActorSelector(Protocol):
    """Chooses who acts next."""

    @property
    def name(self) -> str: ...

    async def select(
        self, actors: Sequence[Actor], state: ProcessState[Any], context: StepContext
    ) -> Selection: ...


class RoundRobinSelector:
    """Each actor in turn, continuing after whoever spoke last (across runs)."""

    name = "round_robin"

    async def select(
        self, actors: Sequence[Actor], state: ProcessState[Any], context: StepContext
    ) -> Selection:
        names = [a.name for a in actors]
        last = state.last_step_result()
        if last is None or last.actor not in names:
            return Selection(names[0], "first turn")
        following = names[(names.index(last.actor) + 1) % len(names)]
        return Selection(following, f"next after {last.actor}")


_NAME_CHARS = re.compile(r"^[\s\"'`*.:]+|[\s\"'`*.:]+$")


class ModelSelector:
    """A model names the next actor; anything else falls back to the first actor.

    Args:
        driver: the model.
        instructions: replaces the default instructions (the actor list is appended).
        request_options: model request fields.
    """

    name = "model"

    def __init__(
        self,
        driver: ModelDriver,
        *,
        instructions: str | None = None,
        request_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.driver = driver
        self.instructions = instructions or (
            "You moderate a conversation. Decide who speaks next. "
            "Answer with exactly one name from the list and nothing else."
        )
        self.request_options = dict(request_options or {})

    def _request(self, actors: Sequence[Actor], state: ProcessState[Any]) -> ModelRequest:
        roster = "\n".join(
            f"- {a.name}" + (f": {a.description}" if a.description else "") for a in actors
        )
        system = Message.system(f"{self.instructions}\n\nParticipants:\n{roster}")
        return ModelRequest(
            messages=(system, *perspective(state.messages, None)), **self.request_options
        )

    async def select(
        self, actors: Sequence[Actor], state: ProcessState[Any], context: StepContext
    ) -> Selection:
        first = actors[0].name
        try:
            response = await complete(self.driver, self._request(actors, state))
        except Exception as exc:
            reason = f"the selector model failed ({exc}); fell back to {first!r}"
            return Selection(first, reason, fallback=True)
        answer = _NAME_CHARS.sub("", response.content)
        for actor in actors:
            if actor.name.casefold() == answer.casefold():
                return Selection(actor.name, "chosen by the model", usage=response.usage)
        known = ", ".join(a.name for a in actors)
        reason = f"the model answered {answer!r}, which is none of {known}; fell back to {first!r}"
        return Selection(first, reason, fallback=True, usage=response.usage)


# --- criteria and the orchestrator ---------------------------------------------------


def turn_criteria(
    max_steps: int = TURN_MAX_STEPS,
    max_tokens: int = TURN_MAX_TOKENS,
    max_retries: int = TURN_MAX_RETRIES,
    finish_reasons: Iterable[FinishReason | str] = TURN_FINISH_REASONS,
    error_policy: ErrorPolicy | None = None,
) -> ContinuationCriteria[Any]:
    """The Chat/Collaboration defaults (see the module docstring)."""
    return ContinuationCriteria(
        StepsLimit(max_steps),
        TokenUsageLimit(max_tokens),
        RetryLimit(max_retries),
        ErrorPolicyCriterion(error_policy or ErrorPolicy.retry_all(max_retries)),
        FinishReasonCheck(finish_reasons),
    )


class TurnOrchestrator(StepByStep[StateT, StepT]):
    """Selector chooses, actor answers, one step per turn (see the module docstring).

    Subclasses set ``state_class``, ``step_class``, ``role_name`` and
    ``selected_event``.

    Args:
        actors: who takes turns (unique names, at least one).
        selector: who chooses (default :class:`RoundRobinSelector`).
        criteria: replaces :func:`turn_criteria` with the limits below.
        max_steps, max_tokens, max_retries: limits of the default criteria.
        error_policy: the error check's policy (default: retry all errors).
        processors, events, clock: see :class:`~agent_core.orchestrators.stepbystep.StepByStep`.
    """

    state_class: ClassVar[type[Any]]
    step_class: ClassVar[type[TurnStep]] = TurnStep
    role_name: ClassVar[str] = "actor"
    selected_event: ClassVar[type[ActorSelected]] = ActorSelected

    def __init__(
        self,
        actors: Iterable[Actor],
        selector: ActorSelector | None = None,
        *,
        criteria: ContinuationCriteria[StateT] | None = None,
        max_steps: int = TURN_MAX_STEPS,
        max_tokens: int = TURN_MAX_TOKENS,
        max_retries: int = TURN_MAX_RETRIES,
        error_policy: ErrorPolicy | None = None,
        processors: Iterable[ProcessorLike[StateT]] | None = None,
        events: EventDispatcher | None = None,
        clock: Clock = utc_now,
    ) -> None:
        policy = error_policy or ErrorPolicy.retry_all(max_retries)
        super().__init__(
            criteria or turn_criteria(max_steps, max_tokens, max_retries, error_policy=policy),
            processors=processors,
            error_policy=policy,
            events=events,
            clock=clock,
        )
        self.roster = self._roster(actors)
        self.selector: ActorSelector = selector or RoundRobinSelector()

    def _roster(self, actors: Iterable[Actor]) -> dict[str, Actor]:
        roster: dict[str, Actor] = {}
        for actor in actors:
            if actor.name in roster:
                raise ValueError(f"two {self.role_name}s are named {actor.name!r}")
            roster[actor.name] = actor
        if not roster:
            raise ValueError(f"a {type(self).__name__} needs at least one {self.role_name}")
        return roster

    def actors(self) -> tuple[str, ...]:
        return tuple(self.roster)

    def new_state(
        self, user_message: str | None = None, *, metadata: Mapping[str, Any] | None = None
    ) -> StateT:
        """A fresh state, optionally opened by a user message."""
        state = cast(StateT, self.state_class(metadata=metadata or {}))
        return state if user_message is None else state.with_user_message(user_message)

    async def run(self, start: str | StateT, *, execution_id: str | None = None) -> StateT:
        """Run one execution from a user message or a state; return the final state."""
        state = self.new_state(start) if isinstance(start, str) else start
        return await self.final_step(state, execution_id=execution_id)

    async def prepare_step(self, state: StateT, context: StepContext) -> StateT:
        selection = await self._choose(state, context)
        self.events.emit(
            self.selected_event(
                **self._meta(state),
                step_number=context.step_number,
                actor=selection.actor,
                selector=self.selector.name,
                reason=selection.reason,
                fallback=selection.fallback,
            )
        )
        details = {
            "selector": self.selector.name,
            "reason": selection.reason,
            "fallback": selection.fallback,
            "usage": selection.usage.model_dump(mode="json"),
        }
        return state.with_actor(selection.actor, details)

    async def _choose(self, state: StateT, context: StepContext) -> Selection:
        results = state.execution_results()
        if results and results[-1].step.errors and results[-1].actor in self.roster:
            failed = results[-1].actor
            return Selection(failed, f"retrying {failed} after a failed turn")
        selection = await self.selector.select(tuple(self.roster.values()), state, context)
        if selection.actor not in self.roster:
            first = next(iter(self.roster))
            reason = f"selector {self.selector.name} chose unknown {selection.actor!r}"
            return Selection(first, f"{reason}; fell back to {first!r}", True, selection.usage)
        return selection

    async def make_next_step(self, state: StateT, context: StepContext) -> StepT:
        current = state.current
        assert current is not None, "a step is in progress"
        assert current.actor is not None, "prepare_step chose the actor"
        actor = self.roster[current.actor]
        turn = Turn(actor.name, state.messages, current.step_number, context, state.metadata)
        reply = await actor.act(turn)
        chosen = Usage.model_validate(current.selection.get("usage") or {})
        if chosen.total:
            reply = ActorReply(
                reply.content,
                reply.finish_reason,
                reply.usage + chosen,
                reply.tool_executions,
                reply.metadata,
            )
        return cast(StepT, self.step_class.from_reply(current.id, actor.name, actor.role, reply))

    def failure_step(self, state: StateT, error: AgentError) -> StepT:
        current = state.current
        step_id = "" if current is None else current.id
        actor = (None if current is None else current.actor) or "(none)"
        return cast(StepT, self.step_class.failure(step_id, actor, error))

    def available_tools(self, state: StateT) -> tuple[str, ...]:
        actor = self.roster.get(state.current_actor() or "")
        tools = getattr(actor, "tools", None)
        return tools.names() if isinstance(tools, ToolRegistry) else ()
