"""Intent classification (docs/agent_core.md, routing): which capability a request needs, with which
arguments.

:class:`RuleBasedClassifier` (the default) matches ordered regular-expression rules;
named groups become arguments. :class:`ModelIntentClassifier` asks a model for a JSON
object ``{"capability": ..., "arguments": {...}}``, validated against the registry.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from agent_core._structured import parse_structured
from agent_core.drivers.base import ModelDriver, ModelRequest, complete
from agent_core.errors import ValidationError
from agent_core.messages import Message, Usage
from agent_core.orchestrators.routing.capabilities import CapabilityRegistry
from agent_core.orchestrators.routing.memory import SessionContext

__all__ = [
    "Intent",
    "IntentClassifier",
    "ModelIntentClassifier",
    "Rule",
    "RuleBasedClassifier",
]


class Intent(BaseModel):
    """A classification: the capability, its arguments, why, and how sure the
    classifier is (``confidence`` 0..1; None when it does not say)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    capability: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    reason: str = ""
    confidence: float | None = Field(default=None, ge=0, le=1)
    usage: Usage = Usage()


class IntentClassifier(Protocol):
    """Names the capability for a request."""

    @property
    def name(self) -> str: ...

    async def classify(self, message: str, context: SessionContext | None) -> Intent:
        """Raises:
        agent_core.errors.AgentError: the request cannot be classified."""
        ...


@dataclass(frozen=True)
class Rule:
    """``pattern`` (a regular expression, searched case-insensitively) selects
    ``capability``; its named groups and ``arguments`` are the arguments;
    ``confidence`` (0..1) and ``reason`` (default: the pattern) are reported with a
    match."""

    capability: str
    pattern: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    confidence: float = 1.0
    reason: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.confidence <= 1:
            raise ValueError(
                f"rule for {self.capability!r}: confidence must be 0..1, got {self.confidence!r}"
            )
        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise ValueError(
                f"rule for {self.capability!r}: bad pattern {self.pattern!r}: {exc}"
            ) from exc

    def match(self, message: str) -> dict[str, Any] | None:
        found = re.search(self.pattern, message, re.IGNORECASE)
        if found is None:
            return None
        groups = {k: v.strip() for k, v in found.groupdict().items() if v is not None}
        return {**self.arguments, **groups}


class RuleBasedClassifier:
    """The first matching rule wins; no match selects ``default`` (with the whole
    message as ``default_argument``), or fails if there is no default.

    Args:
        rules: ordered rules.
        default: the capability for a request no rule matches.
        default_argument: the argument name the message is passed as to ``default``.
        default_confidence: the confidence reported when the default is taken.
    """

    name = "rules"

    def __init__(
        self,
        rules: Iterable[Rule],
        *,
        default: str | None = None,
        default_argument: str = "text",
        default_confidence: float = 0.5,
    ) -> None:
        self.rules = tuple(rules)
        self.default = default
        self.default_argument = default_argument
        self.default_confidence = default_confidence

    async def classify(self, message: str, context: SessionContext | None) -> Intent:
        for rule in self.rules:
            arguments = rule.match(message)
            if arguments is not None:
                reason = rule.reason or f"matched rule {rule.pattern!r}"
                return Intent(
                    capability=rule.capability,
                    arguments=arguments,
                    reason=reason,
                    confidence=rule.confidence,
                )
        if self.default is None:
            raise ValidationError(
                f"no rule matches {message!r} and the classifier has no default capability; "
                "add a rule or a default"
            )
        return Intent(
            capability=self.default,
            arguments={self.default_argument: message},
            reason="no rule matched; default capability",
            confidence=self.default_confidence,
        )


class _Answer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    capability: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)
    reason: str = ""
    confidence: float | None = Field(default=None, ge=0, le=1)


class ModelIntentClassifier:
    """A model classifies the request among the registry's capabilities.

    Raises (from :meth:`classify`):
        agent_core.errors.ValidationError: the answer is not the JSON object asked
            for, or names an unknown capability.
        agent_core.errors.ModelError: the model failed.
    """

    name = "model"

    def __init__(
        self,
        driver: ModelDriver,
        registry: CapabilityRegistry,
        *,
        instructions: str | None = None,
    ) -> None:
        self.driver = driver
        self.registry = registry
        self.instructions = instructions or (
            "Choose the capability that serves the user's request. Answer with one JSON "
            'object: {"capability": "<name>", "arguments": {...}, "reason": "<why>", '
            '"confidence": <0..1>}.'
        )

    async def classify(self, message: str, context: SessionContext | None) -> Intent:
        system = f"{self.instructions}\n\nCapabilities:\n{self.registry.describe()}"
        history = () if context is None else context.messages()
        request = ModelRequest(messages=(Message.system(system), *history, Message.user(message)))
        response = await complete(self.driver, request)
        answer = parse_structured(response.content, _Answer, "the classifier's answer")
        if answer.capability not in self.registry:
            known = ", ".join(self.registry.names())
            raise ValidationError(
                f"the classifier chose unknown capability {answer.capability!r}; known: {known}"
            )
        return Intent(
            capability=answer.capability,
            arguments=answer.arguments,
            reason=answer.reason or "chosen by the model",
            confidence=answer.confidence,
            usage=response.usage,
        )
