"""Demo tools and the demo script: deterministic and safe."""

from __future__ import annotations

import pytest

from agent_core.app.demo_tools import calculator, demo_script, demo_tools, get_weather
from agent_core.drivers.scripted import ScriptedResponse


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
