"""Error answers quote client input only as short excerpts (broadcaster.http_input)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import Request
from starlette.types import Message

from broadcaster.http_input import (
    ClientGone,
    describe_validation,
    excerpt,
    read_body,
    validation_details,
)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    count: int


def errors_of(value: object) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        Strict.model_validate(value)
    return caught.value


def test_short_text_is_quoted_whole() -> None:
    assert excerpt("abc") == "'abc'"


def test_long_text_is_cut_to_100_characters_and_says_how_long_it_was() -> None:
    shown = excerpt("x" * 5000)
    assert shown == repr("x" * 100) + "... (5000 characters)"


def test_details_leave_the_input_out() -> None:
    details = validation_details(errors_of({"name": "n", "count": "y" * 10_000}))
    assert details == [
        {
            "type": "int_parsing",
            "loc": ["count"],
            "msg": "Input should be a valid integer, unable to parse string as an integer",
        }
    ]


def test_client_chosen_field_names_are_cut() -> None:
    details = validation_details(errors_of({"name": "n", "count": 1, "k" * 5000: 1}))
    assert details[0]["loc"] == ["k" * 100 + "..."]


def test_at_most_ten_details_then_a_count() -> None:
    extra = {f"k{n}": n for n in range(50)}
    details = validation_details(errors_of({"name": "n", "count": 1, **extra}))
    assert len(details) == 11
    assert details[-1] == {"type": "more_errors", "loc": [], "msg": "40 more"}


def test_describe_names_the_first_error() -> None:
    message = describe_validation(errors_of({"name": "n"}), "thing")
    assert message == "invalid thing: count: Field required"


async def test_a_client_gone_before_the_end_of_its_body_is_a_refusal() -> None:
    """Not Starlette's ClientDisconnect, which the server would log with a traceback."""
    messages: list[Message] = [
        {"type": "http.request", "body": b'{"input": "hi"}', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> Message:
        return messages.pop(0)

    request = Request({"type": "http", "method": "POST", "headers": []}, receive)
    with pytest.raises(ClientGone) as refused:
        await read_body(request, limit=1000, within=5)
    assert refused.value.status == 499
