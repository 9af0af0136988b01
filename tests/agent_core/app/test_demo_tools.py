"""Demo tools and the demo script: deterministic and safe."""

from __future__ import annotations

import pytest

from agent_core.app.demo_tools import (
    arithmetic_in,
    calculator,
    demo_driver,
    demo_script,
    demo_tools,
    get_weather,
)
from agent_core.builder import AgentBuilder
from agent_core.drivers.scripted import ScriptedResponse
from agent_core.state import AgentState, AgentStatus


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("1 + 2 * 3", 7),
        ("(18 * 9 / 5) + 32", 64.4),
        ("-2 ** 3", -8),
        ("7 // 2 + 7 % 2", 4),
        ("9 ** 64", 9**64),
    ],
)
def test_calculator_evaluates_arithmetic(expression: str, value: float) -> None:
    assert calculator(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os')", "unsupported expression element"),
        ("2 ** 1000", "exponent 1000 is too large"),
        ("1 +", "not an arithmetic expression"),
        ("True + 1", "not a number"),
        # Each exponent is under the cap; the last power alone would take minutes.
        ("((((9) ** 64) ** 64) ** 64) ** 64", "too large \\(over 4096 bits\\)"),
        ("(2 ** 64) ** 64 * 2", "too large"),
        ("(2 ** 60) ** 60 * (2 ** 60) ** 10", "too large"),  # a product over the bound
    ],
)
def test_calculator_rejects_anything_else(expression: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        calculator(expression)


def test_weather_is_deterministic_per_city() -> None:
    assert get_weather("paris") == get_weather("  Paris ")
    report = get_weather("Oslo", unit="fahrenheit")
    assert report["city"] == "Oslo"
    assert report["unit"] == "fahrenheit"
    with pytest.raises(ValueError, match="city must not be empty"):
        get_weather(" ")


def test_demo_tools_and_script_shape() -> None:
    weather, calc = demo_tools()
    assert (weather.name, calc.name) == ("get_weather", "calculator")
    first, *rest = demo_script("What is the weather in New York today?")
    assert isinstance(first, ScriptedResponse)
    assert first.tool_calls[0].arguments == {"city": "New York"}
    assert len(rest) == 2


async def run_demo(question: str) -> AgentState:
    builder = AgentBuilder().with_driver(demo_driver(question)).with_tools(*demo_tools())
    return await builder.build().run(question)


@pytest.mark.parametrize(
    ("question", "tools", "answer"),
    [
        ("What is the weather in Oslo?", ["get_weather", "calculator"], "In Oslo it is"),
        ("And in Lima?", ["get_weather", "calculator"], "In Lima it is"),
        ("What is 6 * 7?", ["calculator"], "6 * 7 = 42."),
        ("What is 12 plus 30?", ["calculator"], "12 + 30 = 42."),
        ("2^10, please", ["calculator"], "2 ** 10 = 1024."),
        ("(18 \u00d7 9 \u00f7 5) + 32", ["calculator"], "(18 * 9 / 5) + 32 = 64.4."),
        ("Hello there", [], "I am the demo's scripted stand-in for a model"),
        ("Tell me about 1984", [], "I am the demo's scripted stand-in for a model"),
    ],
)
async def test_the_demo_agent_picks_its_tools_from_the_question(
    question: str, tools: list[str], answer: str
) -> None:
    """Weather -> get_weather (then calculator), arithmetic -> calculator with the
    real result, anything else -> a plain answer that says it is scripted."""
    state = await run_demo(question)
    assert state.status is AgentStatus.COMPLETED
    assert [c.name for step in state.steps() for c in step.tool_calls] == tools
    assert state.final_response().startswith(answer)
    if not tools:
        assert "agent_core/drivers/openai.py" in state.final_response()


@pytest.mark.parametrize(
    "question", ["What is 6 * 7? [fail:tool]", "What is 6 * 7? [fail:model]", "hi [fail:tool]"]
)
async def test_the_failure_markers_still_fail_step_two(question: str) -> None:
    state = await run_demo(question)
    assert state.status is AgentStatus.FAILED
    assert len(state.steps()) == 2


def test_arithmetic_is_found_in_linear_time_on_long_input() -> None:
    assert arithmetic_in("1" + " " * 20_000 + "x") is None
    assert arithmetic_in("(" * 10_000 + "1") is None
    assert arithmetic_in("a " * 10_000 + "3 + 4") == "3 + 4"
