"""The demo's capability router (behind ``POST /run {"mode": "route"}``).

Three capabilities:

- ``weather_agent``: the demo agent (weather + calculator tools) run on the request
  (weather questions and arithmetic);
- ``chat``: a plain chat answer;
- ``summarize``: a short summary of the text after ``summarize:``.

With the scripted driver everything is deterministic and offline: a rule-based
classifier (summary requests, then weather requests and arithmetic, else chat), a
follow-up resolver ("and in Paris?" after a weather request asks about Paris), scripted
chat and summary answers. With ``AGENT_DEMO_DRIVER=openai`` the classifier, the resolver and the
capabilities use the OpenAI-compatible driver. The decider is the no-op one (the routing design's
production default): each request runs one capability.

:func:`demo_parts` gives what :class:`~agent_core.app.runs.RunManager` needs (the agent's
driver factory and tools, and the router factory); the demo's composition root
(:mod:`agent_core.app.demo`) and ``agent-worker`` pass them in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from agent_core.adapters.orchestration_broadcasting import nested_run_adapter
from agent_core.app.demo_tools import demo_driver, demo_tools
from agent_core.app.runs import DriverFactory, PacedDriver, RouterFactory, RunRequest, ToolsFactory
from agent_core.builder import AgentBuilder
from agent_core.drivers.base import ModelDriver, ModelRequest, complete
from agent_core.drivers.scripted import ScriptedDriver, ScriptedResponse
from agent_core.messages import Message
from agent_core.orchestrators.routing.capabilities import CapabilityRegistry, CapabilityResult
from agent_core.orchestrators.routing.classifier import (
    IntentClassifier,
    ModelIntentClassifier,
    Rule,
    RuleBasedClassifier,
)
from agent_core.orchestrators.routing.memory import (
    ModelReferenceResolver,
    ReferenceResolver,
    Resolution,
    SessionContext,
    SessionMemory,
)
from agent_core.orchestrators.routing.router import ROUTING_MAX_STEPS, CapabilityRouter
from agent_core.state import AgentStatus

__all__ = [
    "ChatCapability",
    "DemoParts",
    "FollowUpResolver",
    "SummarizeCapability",
    "WeatherAgentCapability",
    "demo_classifier",
    "demo_parts",
]

DriverKind = Literal["scripted", "openai"]
_TEXT = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
SUMMARY_WORDS = 12
"""Words the scripted summary keeps."""


def _text(arguments: Mapping[str, Any]) -> str:
    text = arguments.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ValueError("the capability needs a non-empty 'text' argument")
    return text


class WeatherAgentCapability:
    """The demo agent (weather and calculator tools) as one capability."""

    name = "weather_agent"
    description = "Answers weather questions with the weather and calculator tools."
    parameters: Mapping[str, Any] = _TEXT

    def __init__(self, driver_factory: DriverFactory, tools: ToolsFactory) -> None:
        self.driver_factory = driver_factory
        self.tools = tools

    async def execute(self, arguments: Mapping[str, Any]) -> CapabilityResult:
        text = _text(arguments)
        builder = AgentBuilder().with_driver(self.driver_factory(text)).with_tools(*self.tools())
        nested = nested_run_adapter()  # published under the capability's call
        if nested is None:
            state = await builder.build().run(text)
        else:
            try:
                state = await nested.install(builder).build().run(text)
            finally:
                await nested.aclose()
        steps = state.steps()
        metadata: dict[str, Any] = {
            "agent_steps": len(steps),
            "tools": [c.name for step in steps for c in step.tool_calls],
        }
        error = state.error_message()
        if error is not None:
            metadata["error"] = f"the agent failed: {error}"
        return CapabilityResult(
            capability=self.name,
            output=state.final_response(),
            success=state.status is AgentStatus.COMPLETED,
            metadata=metadata,
            usage=state.usage,
        )


class _ModelCapability:
    """A capability that is one model answer to a system prompt and the text."""

    name = ""
    description = ""
    parameters: Mapping[str, Any] = _TEXT
    instructions = ""

    def __init__(self, driver_factory: DriverFactory) -> None:
        self.driver_factory = driver_factory

    def prompt(self, text: str) -> str:
        return text

    async def execute(self, arguments: Mapping[str, Any]) -> CapabilityResult:
        text = self.prompt(_text(arguments))
        request = ModelRequest(messages=(Message.system(self.instructions), Message.user(text)))
        response = await complete(self.driver_factory(text), request)
        return CapabilityResult(capability=self.name, output=response.content, usage=response.usage)


class ChatCapability(_ModelCapability):
    """A plain chat answer."""

    name = "chat"
    description = "Answers a general message conversationally."
    instructions = "You are a helpful assistant. Answer briefly."


class SummarizeCapability(_ModelCapability):
    """A short summary of the text after ``summarize:``."""

    name = "summarize"
    description = "Summarizes the given text in one short sentence."
    instructions = "Summarize the user's text in one short sentence."

    def prompt(self, text: str) -> str:
        return _to_summarize(text)


_SUMMARY = re.compile(r"^\s*(?:summari[sz]e|tl;?dr)\b\W*", re.IGNORECASE)


def _to_summarize(text: str) -> str:
    """The text without a leading ``summarize:``."""
    return _SUMMARY.sub("", text, count=1).strip() or text


_PLACE = re.compile(r"\b(?:in|for|at)\s+[A-Z][\w-]*(?:\s+[A-Z][\w-]*)*")
_FOLLOW_UP = re.compile(
    r"^\s*(?:and|what about|how about)\s+(?P<place>(?:in|for|at)\s+[A-Z][\w-]*(?:\s+[A-Z][\w-]*)*)",
    re.IGNORECASE,
)


class FollowUpResolver:
    """Deterministic reference resolution for the scripted demo: a follow-up such as
    "and in Paris?" repeats the previous request with the new place; anything else is
    left as it is."""

    async def resolve(self, message: str, context: SessionContext) -> Resolution:
        last = context.last_turn()
        follow_up = _FOLLOW_UP.match(message)
        if last is None or follow_up is None:
            return Resolution(message)
        previous = last.resolved_input or last.input
        if _PLACE.search(previous) is None:
            return Resolution(message)
        return Resolution(_PLACE.sub(follow_up.group("place"), previous, count=1))


def demo_classifier() -> RuleBasedClassifier:
    """Summary requests, then weather requests and arithmetic (the agent has the
    weather and calculator tools); anything else is chat."""
    rules = [
        Rule(
            "summarize",
            r"^\s*(?:summari[sz]e|tl;?dr)\b\W*(?P<text>.+)",
            confidence=0.95,
            reason="the request asks for a summary",
        ),
        Rule(
            "weather_agent",
            # The whole message, when it names the weather anywhere. A lookahead from the
            # start: ".*\bweather\b.*" searched from every position took O(n²), 7 s of
            # the event loop for a 20,000-character message.
            r"(?s)^(?=.*\b(?:weather|temperature|forecast|warm|cold)\b)(?P<text>.*)",
            confidence=0.9,
            reason="the request is about the weather",
        ),
        Rule(
            "weather_agent",
            # A number, an operator, a number (the agent's calculator); anchored like
            # the weather rule, so one pass over the message.
            r"(?s)^(?=.*\d[\s)]*(?:\*\*|[-+*/%\u00d7\u00f7^]|\b(?:plus|minus|times|x)\b)[\s(]*\d)(?P<text>.*)",
            confidence=0.8,
            reason="the request is arithmetic (the agent has a calculator)",
        ),
    ]
    return RuleBasedClassifier(rules, default="chat", default_confidence=0.4)


def _chat_reply(text: str) -> str:
    return (
        f"You said: {text.strip()!r}. I route each request to a capability: ask about "
        "the weather somewhere, ask for arithmetic (e.g. 'What is 6 * 7?'), or write "
        "'summarize: <text>'. (A scripted stand-in for a model answers here; "
        "AGENT_DEMO_DRIVER=openai uses a real one.)"
    )


def _summary(text: str) -> str:
    words = _to_summarize(text).split()
    short = " ".join(words[:SUMMARY_WORDS]) + ("…" if len(words) > SUMMARY_WORDS else "")
    return f"Summary ({len(words)} words): {short}"


def _answer(make: Callable[[str], str]) -> DriverFactory:
    return lambda text: ScriptedDriver([ScriptedResponse(text=make(text))])


@dataclass(frozen=True)
class DemoParts:
    """What runs are made of: the agent's driver factory and tools (agent mode) and
    the router factory (route mode)."""

    driver_factory: DriverFactory
    tools: ToolsFactory
    router_factory: RouterFactory


def demo_parts(driver: DriverKind = "scripted") -> DemoParts:
    """The demo's parts for the scripted or the OpenAI-compatible driver."""
    if driver == "scripted":
        return _parts(demo_driver, _answer(_chat_reply), _answer(_summary), None)
    from agent_core.drivers.openai import OpenAIChatDriver

    def openai(_text: str) -> ModelDriver:
        return OpenAIChatDriver()

    return _parts(openai, openai, openai, OpenAIChatDriver)


def _parts(
    agent: DriverFactory,
    chat: DriverFactory,
    summary: DriverFactory,
    model: Callable[[], ModelDriver] | None,
) -> DemoParts:
    def router(request: RunRequest, memory: SessionMemory) -> CapabilityRouter:
        pace = request.pace_ms / 1000

        def paced(make: DriverFactory) -> DriverFactory:
            return (lambda text: PacedDriver(make(text), pace)) if pace else make

        registry = CapabilityRegistry(
            [
                WeatherAgentCapability(paced(agent), demo_tools),
                ChatCapability(paced(chat)),
                SummarizeCapability(paced(summary)),
            ]
        )
        classifier: IntentClassifier = demo_classifier()
        resolver: ReferenceResolver = FollowUpResolver()
        if model is not None:
            classifier = ModelIntentClassifier(model(), registry)
            resolver = ModelReferenceResolver(model())
        limit = min(request.max_steps or ROUTING_MAX_STEPS, ROUTING_MAX_STEPS)
        return CapabilityRouter(
            registry, classifier, resolver=resolver, memory=memory, max_steps=limit
        )

    return DemoParts(driver_factory=agent, tools=demo_tools, router_factory=router)
