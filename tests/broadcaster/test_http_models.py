"""HTTP API bodies: trigger and batch events validated with clear 400/413 errors."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from broadcaster.exceptions import ApiError
from broadcaster.http_models import TriggerRequest, parse_batch, parse_info, parse_trigger
from broadcaster.settings import AppConfig

APP = AppConfig(id="3", key="k", secret="s")


def body(**fields: Any) -> bytes:
    return orjson.dumps(fields)


def refused(raw: bytes, app: AppConfig = APP) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_trigger(raw, app)
    return info.value


def test_the_protocol_vector_body_parses() -> None:
    raw = b'{"name":"foo","channels":["project-3"],"data":"{\\"some\\":\\"data\\"}"}'
    assert parse_trigger(raw, APP) == TriggerRequest(
        name="foo", data='{"some":"data"}', channels=("project-3",)
    )


def test_single_channel_socket_id_and_info_are_normalized() -> None:
    raw = body(name="e", data="x", channel="agent.1", socket_id="1.2", info="user_count")
    assert parse_trigger(raw, APP) == TriggerRequest(
        name="e",
        data="x",
        channels=("agent.1",),
        socket_id="1.2",
        info=frozenset({"user_count"}),
    )


def test_duplicate_channels_are_published_once_in_order() -> None:
    raw = body(name="e", data="x", channels=["b", "a", "b"])
    assert parse_trigger(raw, APP).channels == ("b", "a")


def test_unknown_fields_are_ignored_for_newer_sdks() -> None:
    assert parse_trigger(body(name="e", data="x", channel="a", tags=["t"]), APP).name == "e"


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"", "request body is empty"),
        (b"{", "request body is not valid JSON"),
        (b"[]", "request body must be a JSON object"),
        (body(data="x", channel="a"), "name is required"),
        (body(name="e", channel="a"), "data is required"),
        (body(name="e", data={"a": 1}, channel="a"), "data must be a string: encode objects"),
        (body(name=5, data="x", channel="a"), "name: Input should be a valid string"),
        (body(name="", data="x", channel="a"), "name is empty"),
        (body(name="e" * 201, data="x", channel="a"), "201 characters long; the limit is 200"),
        (body(name="pusher:x", data="x", channel="a"), "'pusher:x' is reserved"),
        (body(name="pusher_internal:x", data="x", channel="a"), "is reserved"),
        (body(name="broadcaster:resume", data="x", channel="a"), "is reserved"),
        (body(name="e", data="x"), "give exactly one of 'channel' or 'channels'"),
        (body(name="e", data="x", channel="a", channels=["b"]), "exactly one of"),
        (body(name="e", data="x", channels=[]), "channels is empty"),
        (body(name="e", data="x", channels="a"), "channels: Input should be a valid list"),
        (body(name="e", data="x", channels=[f"c{i}" for i in range(101)]), "101 channels"),
        (body(name="e", data="x", channel="a b"), "invalid channel: channel name 'a b'"),
        (body(name="e", data="x", channel="x" * 165), "the limit is 164"),
        (body(name="e", data="x", channel="a", socket_id="abc"), "socket_id 'abc' is not"),
        (body(name="e", data="x", channel="a", socket_id=12), "socket_id: Input should be"),
        (body(name="e", data="x", channel="a", info="bogus"), "info: unknown info attribute"),
    ],
)
def test_bad_trigger_bodies_get_400_saying_what_is_wrong(raw: bytes, fragment: str) -> None:
    error = refused(raw)
    assert error.status == 400
    assert fragment in error.message


def test_data_over_the_limit_is_413() -> None:
    error = refused(body(name="e", data="é" * 5121, channel="a"))
    assert error.status == 413
    assert "data is 10242 bytes; the limit is 10240 bytes" in error.message


def test_limits_come_from_the_app() -> None:
    app = AppConfig(id="3", key="k", secret="s", max_event_channels=2, max_event_data_size=3)
    assert (
        "the limit is 2" in refused(body(name="e", data="x", channels=["a", "b", "c"]), app).message
    )
    assert refused(body(name="e", data="xxxx", channel="a"), app).status == 413


def test_a_batch_parses_into_requests() -> None:
    raw = body(
        batch=[
            {"name": "a", "data": "1", "channel": "c1"},
            {"name": "b", "data": "2", "channel": "c2", "socket_id": "1.1"},
        ]
    )
    assert parse_batch(raw, APP) == [
        TriggerRequest(name="a", data="1", channels=("c1",)),
        TriggerRequest(name="b", data="2", channels=("c2",), socket_id="1.1"),
    ]


@pytest.mark.parametrize(
    ("raw", "status", "fragment"),
    [
        (b"{}", 400, "batch is required"),
        (body(batch={}), 400, "batch: Input should be a valid list"),
        (body(batch=[]), 400, "batch is empty"),
        (
            body(batch=[{"name": "a", "data": "1", "channel": "c"}] * 11),
            400,
            "11 events; the limit is 10",
        ),
        (
            body(batch=[{"name": "a", "data": "1", "channel": "c"}, 5]),
            400,
            "batch[1]: event must be a JSON object",
        ),
        (
            body(batch=[{"name": "a", "data": 1, "channel": "c"}]),
            400,
            "batch[0]: data must be a string",
        ),
        (body(batch=[{"name": "a", "data": "1"}]), 400, "batch[0]: give exactly one"),
        (
            body(batch=[{"name": "a", "data": "x" * 10241, "channel": "c"}]),
            413,
            "batch[0]: data is 10241 bytes",
        ),
    ],
)
def test_bad_batches_say_which_event_is_wrong(raw: bytes, status: int, fragment: str) -> None:
    with pytest.raises(ApiError) as info:
        parse_batch(raw, APP)
    assert info.value.status == status
    assert fragment in info.value.message


def test_info_attributes() -> None:
    assert parse_info(None) == frozenset()
    assert parse_info("user_count, subscription_count") == {"user_count", "subscription_count"}
    with pytest.raises(ApiError, match="unknown info attribute"):
        parse_info("user_count,bogus")


def test_a_bad_socket_id_is_quoted_only_as_an_excerpt() -> None:
    body = {"name": "e", "channel": "c", "data": "{}", "socket_id": "9" * 5000}
    with pytest.raises(ApiError) as caught:
        parse_trigger(orjson.dumps(body), APP)
    assert caught.value.status == 400
    assert "(5000 characters)" in caught.value.message


PLAIN_EVENTS = [
    {"name": "a", "data": "x", "channel": "c"},
    {"name": "a", "data": "", "channels": ["c", "d", "c"], "socket_id": "1.2", "info": "x"},
    {"name": "", "data": "x", "channel": None, "channels": [], "socket_id": None, "info": None},
    {"name": "a", "data": "x", "channel": "c", "extra": [1, {"y": 2}]},
]
ODD_EVENTS = [
    {"data": "x", "channel": "c"},
    {"name": 1, "data": "x", "channel": "c"},
    {"name": "a", "data": {"k": 1}, "channel": "c"},
    {"name": "a", "data": "x", "channel": ["c"]},
    {"name": "a", "data": "x", "channels": "c"},
    {"name": "a", "data": "x", "channels": ["c", 2]},
    {"name": "a", "data": "x", "channel": "c", "socket_id": 1.5},
    {"name": "a", "data": "x", "channel": "c", "info": ["user_count"]},
]


@pytest.mark.parametrize("event", PLAIN_EVENTS)
def test_plainly_typed_events_read_as_pydantic_reads_them(event: dict[str, Any]) -> None:
    """The fields read without pydantic (the common case) are those it would give."""
    from broadcaster.http_models import _EventBody, _plain_event

    plain = _plain_event(event)
    valid = _EventBody.model_validate(event)
    assert plain is not None
    fields = ("name", "data", "channel", "channels", "socket_id", "info")
    assert [getattr(plain, f) for f in fields] == [getattr(valid, f) for f in fields]


@pytest.mark.parametrize("event", ODD_EVENTS)
def test_anything_else_is_left_to_pydantic_and_refused_with_its_reason(
    event: dict[str, Any],
) -> None:
    from broadcaster.http_models import _plain_event

    assert _plain_event(event) is None
    assert refused(orjson.dumps(event)).status == 400


@pytest.mark.parametrize(
    "event",
    [
        {"name": "ev", "data": "d", "channel": "agent.1"},
        {"name": "", "data": "d", "channel": "agent.1"},
        {"name": "pusher:ev", "data": "d", "channel": "agent.1"},
        {"name": "e" * 201, "data": "d", "channel": "agent.1"},
        {"name": "ev", "data": "\u00e9" * 5_121, "channel": "agent.1"},
        {"name": "ev", "data": "\U0001f600" * 2_560, "channel": "agent.1"},
        {"name": "ev", "data": "\U0001f600" * 2_561, "channel": "agent.1"},
        {"name": "ev", "data": "x" * 10_241, "channel": "agent.1"},
        {"name": "ev", "data": "d", "channel": ""},
        {"name": "ev", "data": "d", "channel": "bad channel"},
        {"name": "ev", "data": "d", "channel": "#server-to-user-"},
    ],
)
def test_the_usual_event_is_read_as_the_general_path_reads_it(event: dict[str, Any]) -> None:
    """A three-field event (the shortcut) gets the result or refusal that the same
    event with a null field more (the general path) gets."""

    def outcome(raw: bytes) -> TriggerRequest | tuple[int, str]:
        try:
            return parse_trigger(raw, APP)
        except ApiError as exc:
            return exc.status, exc.message

    assert outcome(body(**event)) == outcome(body(**event, socket_id=None))
