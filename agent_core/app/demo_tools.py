"""Two deterministic demo tools and the scripted stand-in for a model that uses them.

``get_weather`` invents weather from a hash of the city name (same city, same weather),
``calculator`` evaluates arithmetic safely (no ``eval``). :func:`demo_script` is what
the demo agent "thinks" without a model: it picks its tools from the question, as a
model would, but by rules:

- a weather question (weather, temperature, forecast, warm, cold, or a place such as
  "And in Lima?"): call ``get_weather`` for the city named (default Paris), convert
  its temperature with ``calculator``, stream an answer built from both results;
- arithmetic ("What is 6 * 7?", "12 plus 30", "2^10"): call ``calculator`` with the
  expression, answer with its real result ("6 * 7 = 42.");
- anything else: a plain answer saying what this stand-in can do.

A real model answers anything: ``AGENT_DEMO_DRIVER=openai`` runs the demo with
:class:`agent_core.drivers.openai.OpenAIChatDriver` (any chat-completions API).

To see how a failure looks, put ``[fail:model]`` in the input (the model fails in step
2, after the first tool call) or ``[fail:tool]`` (step 2 calls the calculator with an
expression it rejects). With ``max_steps: 2`` that is the run's last allowed step. A
question with neither weather nor arithmetic in it takes the weather script when it
carries one of these markers (a plain answer has no step 2).
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import re
from collections.abc import Callable
from typing import Any, Literal

from agent_core.drivers.base import ModelRequest
from agent_core.drivers.scripted import (
    ScriptedDriver,
    ScriptedFailure,
    ScriptedResponse,
    ScriptedTurn,
    call,
)
from agent_core.errors import ModelError
from agent_core.messages import Role
from agent_core.tools import Tool

__all__ = [
    "FAIL_MODEL",
    "FAIL_TOOL",
    "arithmetic_in",
    "calculator",
    "demo_driver",
    "demo_script",
    "demo_tools",
    "get_weather",
    "is_weather_question",
    "plain_answer",
]

FAIL_MODEL = "[fail:model]"
"""In a demo input: the scripted model fails in step 2."""
FAIL_TOOL = "[fail:tool]"
"""In a demo input: step 2's calculator call fails."""

_CONDITIONS = ("sunny", "cloudy", "rainy", "windy", "foggy", "snowy")
_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_MAX_EXPONENT = 64
_MAX_BITS = 4096  # of an integer result (about 1,233 digits): (9**64)**64... stays cheap


def _evaluate(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        if isinstance(node.value, bool):
            raise ValueError(f"not a number: {node.value!r}")
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))  # type: ignore[no-any-return]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            if abs(right) > _MAX_EXPONENT:
                raise ValueError(f"exponent {right} is too large (at most {_MAX_EXPONENT})")
            # Checked before computing: a power of a power of ... passes the exponent
            # cap at each step, and the last step alone could take minutes.
            if isinstance(left, int) and isinstance(right, int) and right > 0:
                _check_bits(left.bit_length() * right)
        result = _BINARY[type(node.op)](left, right)
        if isinstance(result, int):
            _check_bits(result.bit_length())
        return result  # type: ignore[no-any-return]
    raise ValueError(f"unsupported expression element: {ast.unparse(node)!r}")


def _check_bits(bits: int) -> None:
    if bits > _MAX_BITS:
        raise ValueError(f"the result would be too large (over {_MAX_BITS} bits)")


def calculator(expression: str) -> float | int:
    """Evaluate an arithmetic expression.

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "(18 * 9 / 5) + 32".
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from exc
    result = _evaluate(tree.body)
    return round(result, 10) if isinstance(result, float) else result


def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> dict[str, Any]:
    """Current weather for a city (invented deterministically for the demo).

    Args:
        city: the city name, e.g. "Paris".
        unit: temperature unit.
    """
    name = " ".join(city.split()).title()
    if not name:
        raise ValueError("city must not be empty")
    digest = hashlib.sha256(name.lower().encode()).digest()
    celsius = digest[0] % 40 - 5
    temperature = celsius if unit == "celsius" else round(celsius * 9 / 5 + 32, 1)
    return {
        "city": name,
        "temperature": temperature,
        "unit": unit,
        "conditions": _CONDITIONS[digest[1] % len(_CONDITIONS)],
        "humidity": 30 + digest[2] % 60,
    }


def demo_tools() -> tuple[Tool, Tool]:
    """The demo's tools: ``get_weather`` and ``calculator``."""
    return Tool.from_function(get_weather), Tool.from_function(calculator)


def _city(text: str) -> str:
    match = re.search(r"\b(?:in|for|at)\s+([A-Z][\w-]*(?:\s+[A-Z][\w-]*)*)", text)
    return match.group(1) if match else "Paris"


def _tool_output(request: ModelRequest, call_id: str) -> str:
    for message in reversed(request.messages):
        if message.role is Role.TOOL and message.tool_call_id == call_id:
            return message.content
    raise LookupError(f"no tool result for call {call_id} in the request")


def _convert(request: ModelRequest) -> ScriptedResponse | ScriptedFailure:
    weather = json.loads(_tool_output(request, "call_weather_1"))
    expression = f"{weather['temperature']} * 9 / 5 + 32"
    return ScriptedResponse(tool_calls=(call("calculator", "call_calc_1", expression=expression),))


def _answer(request: ModelRequest) -> ScriptedResponse | ScriptedFailure:
    weather = json.loads(_tool_output(request, "call_weather_1"))
    fahrenheit = _tool_output(request, "call_calc_1")
    text = (
        f"In {weather['city']} it is {weather['conditions']} at {weather['temperature']} °C "
        f"({fahrenheit} °F), with {weather['humidity']}% humidity."
    )
    return ScriptedResponse(text=text)


def _broken_convert(request: ModelRequest) -> ScriptedResponse | ScriptedFailure:
    expression = "the temperature in fahrenheit"
    return ScriptedResponse(tool_calls=(call("calculator", "call_calc_1", expression=expression),))


def demo_script(input_text: str) -> list[ScriptedTurn]:
    """The scripted turns for ``input_text`` (see the module docstring): the weather
    script, the arithmetic script or a plain answer, with :data:`FAIL_MODEL` or
    :data:`FAIL_TOOL` making step 2 fail."""
    failing = FAIL_MODEL in input_text or FAIL_TOOL in input_text
    if not is_weather_question(input_text):
        expression = arithmetic_in(input_text)
        if expression is not None:
            return _arithmetic_script(input_text, expression)
        if not failing:
            return [ScriptedResponse(text=plain_answer(input_text))]
    return _weather_script(input_text)


def _weather_script(input_text: str) -> list[ScriptedTurn]:
    """Three turns: call ``get_weather`` for the city named in ``input_text`` (default
    Paris), convert its temperature with ``calculator``, stream the answer."""
    city = _city(input_text)
    first = ScriptedResponse(
        text=f"Let me check the weather in {city}.",
        tool_calls=(call("get_weather", "call_weather_1", city=city),),
    )
    return [first, *_then(input_text, _convert, _answer)]


def _arithmetic_script(input_text: str, expression: str) -> list[ScriptedTurn]:
    """Two turns: call ``calculator`` with ``expression``, answer with its result."""
    first = ScriptedResponse(
        text=f"Let me compute {expression}.",
        tool_calls=(call("calculator", "call_calc_0", expression=expression),),
    )

    def answer(request: ModelRequest) -> ScriptedResponse | ScriptedFailure:
        return ScriptedResponse(text=f"{expression} = {_tool_output(request, 'call_calc_0')}.")

    if FAIL_MODEL in input_text or FAIL_TOOL in input_text:
        return [first, *_then(input_text, answer, answer)]
    return [first, answer]


def _then(input_text: str, *turns: ScriptedTurn) -> list[ScriptedTurn]:
    """``turns``, or the failure the input asks for in their place (step 2)."""
    if FAIL_MODEL in input_text:
        failure = ModelError(f"the demo model failed on purpose ({FAIL_MODEL} in the input)")
        return [ScriptedFailure(failure)]
    if FAIL_TOOL in input_text:
        return [_broken_convert, turns[-1]]
    return list(turns)


_WEATHER = re.compile(r"\b(?:weather|temperature|forecast|warm|cold)\b", re.IGNORECASE)
_PLACE = re.compile(r"\b(?:in|for|at)\s+[A-Z][\w-]*")
_WORDS = (
    (re.compile(r"\b(?:multiplied\s+by|times)\b", re.IGNORECASE), " * "),
    (re.compile(r"\bdivided\s+by\b", re.IGNORECASE), " / "),
    (re.compile(r"\bplus\b", re.IGNORECASE), " + "),
    (re.compile(r"\bminus\b", re.IGNORECASE), " - "),
    (re.compile(r"\bmod(?:ulo)?\b", re.IGNORECASE), " % "),
    (re.compile(r"(?<=[\d)])\s?[x\u00d7]\s?(?=[\d(])"), " * "),
    (re.compile("\u00f7"), " / "),
    (re.compile(r"\^"), " ** "),
)
_EXPRESSION = re.compile(r"[-+(]*\s*\d[\d\s.()+\-*/%]*")
_OPERATION = re.compile(r"[\d)]\s*(?:\*\*|//|[-+*/%])\s*[-+(]*\s*\d")


def is_weather_question(text: str) -> bool:
    """Whether the demo agent treats ``text`` as a weather question."""
    return _WEATHER.search(text) is not None or (
        _PLACE.search(text) is not None and arithmetic_in(text) is None
    )


def arithmetic_in(text: str) -> str | None:
    """The arithmetic expression in ``text`` (the multiplication and division signs,
    ``x`` between numbers, ``^`` and the words plus, minus, times, divided by, mod as
    operators), or None if it has none."""
    text = " ".join(text.split())  # one space at most: every pattern below is linear
    for pattern, operator_ in _WORDS:
        text = pattern.sub(operator_, text)
    for match in _EXPRESSION.finditer(text):
        candidate = match.group().strip().rstrip("+-*/%( ").strip()
        if _OPERATION.search(candidate) and candidate.count("(") == candidate.count(")"):
            return " ".join(candidate.split())
    return None


def plain_answer(text: str) -> str:
    """The stand-in's answer to what it has no tool for."""
    asked = " ".join(text.split())
    asked = asked if len(asked) <= 80 else asked[:79] + "…"
    return (
        f"I am the demo's scripted stand-in for a model, so I cannot really answer "
        f"“{asked}”. I can look up the (invented) weather of a city "
        "or compute arithmetic: try 'What is the weather in Oslo?' or 'What is 6 * 7?'. "
        "For real answers, run the demo with AGENT_DEMO_DRIVER=openai "
        "(agent_core/drivers/openai.py talks to any chat-completions model)."
    )


def demo_driver(input_text: str) -> ScriptedDriver:
    """A :class:`ScriptedDriver` playing :func:`demo_script`."""
    return ScriptedDriver(demo_script(input_text))
