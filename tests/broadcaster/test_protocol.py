"""The sans-I/O Pusher protocol: client messages in, commands out, server frames built."""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broadcaster import protocol
from broadcaster.channels import ChannelKind
from broadcaster.codes import ErrorCode
from broadcaster.exceptions import ProtocolError
from broadcaster.protocol import (
    RESUME_EVENT,
    ClientEvent,
    Command,
    Ping,
    Pong,
    PresenceMember,
    SignedInUser,
    Signin,
    Subscribe,
    Unsubscribe,
    authorize_signin,
    authorize_subscription,
    channel_event,
    check_client_event,
    connection_established,
    error,
    is_valid_socket_id,
    member_added,
    member_removed,
    new_socket_id,
    parse_client_message,
    parse_presence_member,
    ping,
    pong,
    presence_member_limit,
    resume_result,
    signin_success,
    subscription_count,
    subscription_error,
    subscription_succeeded,
)
from broadcaster.publication import Position, Publication, make_position, make_publication
from broadcaster.settings import AppConfig
from broadcaster.signing import channel_auth, sign, user_auth

KEY = "278d425bdf160c739803"
SECRET = "7ad3773142a6692b25b8"  # the protocol documentation's test secret
APP = AppConfig(id="3", key=KEY, secret=SECRET, enable_client_messages=True)
LIMIT = 10_240


def parse(text: str | bytes) -> Command:
    return parse_client_message(text, LIMIT)


def refused(text: str | bytes, max_size: int = LIMIT) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_client_message(text, max_size)
    return info.value


# -- parsing valid messages -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "command"),
    [
        ('{"event":"pusher:ping","data":{}}', Ping()),
        ('{"event":"pusher:ping","data":"{}"}', Ping()),
        ('{"event":"pusher:ping"}', Ping()),
        ('{"event":"pusher:pong","data":""}', Pong()),
        (
            '{"event":"pusher:subscribe","data":{"channel":"agent.1"}}',
            Subscribe("agent.1"),
        ),
        (
            '{"event":"pusher:subscribe","data":"{\\"channel\\":\\"agent.1\\"}"}',
            Subscribe("agent.1"),
        ),
        (
            '{"event":"pusher:subscribe","data":{"channel":"private-agent.1","auth":"k:s"}}',
            Subscribe("private-agent.1", auth="k:s"),
        ),
        (
            '{"event":"pusher:subscribe","data":{"channel":"agent.1","position":"ep-1:42"}}',
            Subscribe("agent.1", resume_from=Position(offset=42, epoch="ep-1")),
        ),
        (
            '{"event":"pusher:unsubscribe","data":{"channel":"agent.1"}}',
            Unsubscribe("agent.1"),
        ),
        (
            '{"event":"client-typing","channel":"private-a","data":{"who":"ada"}}',
            ClientEvent("client-typing", "private-a", '{"who":"ada"}'),
        ),
        (
            '{"event":"client-typing","channel":"private-a","data":"hello"}',
            ClientEvent("client-typing", "private-a", "hello"),
        ),
        (
            '{"event":"client-typing","channel":"private-a"}',
            ClientEvent("client-typing", "private-a", "null"),
        ),
    ],
)
def test_valid_messages_parse_into_commands(text: str, command: Command) -> None:
    assert parse(text) == command


def test_utf8_binary_frames_are_accepted_like_text() -> None:
    assert parse(b'{"event":"pusher:ping","data":{}}') == Ping()


def test_presence_subscribe_carries_the_parsed_member() -> None:
    channel_data = '{"user_id":"42","user_info":{"name":"Ada"}}'
    text = orjson.dumps(
        {
            "event": "pusher:subscribe",
            "data": {"channel": "presence-a", "auth": "k:s", "channel_data": channel_data},
        }
    )
    command = parse(text)
    assert isinstance(command, Subscribe)
    assert command.kind is ChannelKind.PRESENCE
    assert command.channel_data == channel_data
    assert command.member == PresenceMember("42", {"name": "Ada"})


def test_signin_carries_the_signed_text_and_the_user() -> None:
    user_data = '{"id":"u1","user_info":{"name":"Ada"}}'
    text = orjson.dumps({"event": "pusher:signin", "data": {"auth": "k:s", "user_data": user_data}})
    assert parse(text) == Signin("k:s", user_data, SignedInUser("u1", {"name": "Ada"}))


# -- refusing malformed messages --------------------------------------------------------

SUB = '{"event":"pusher:subscribe","data":%s}'


@pytest.mark.parametrize(
    ("text", "code", "fragment"),
    [
        (b"\xff\xfe", ErrorCode.INVALID_MESSAGE, "binary message is not UTF-8 text"),
        ("\ud800", ErrorCode.INVALID_MESSAGE, "lone surrogate"),
        ("not json", ErrorCode.INVALID_MESSAGE, "message is not valid JSON"),
        ("", ErrorCode.INVALID_MESSAGE, "message is not valid JSON"),
        ("[1,2]", ErrorCode.INVALID_MESSAGE, "must be a JSON object like"),
        ('"pusher:ping"', ErrorCode.INVALID_MESSAGE, "got a string"),
        ("[" * 1100 + "]" * 1100, ErrorCode.INVALID_MESSAGE, "nested deeper than 1024"),
        ('{"data":{}}', ErrorCode.INVALID_MESSAGE, "'event' must be a string, got null"),
        ('{"event":7}', ErrorCode.INVALID_MESSAGE, "'event' must be a string, got a number"),
        ('{"event":"pusher:subscribe"}', ErrorCode.INVALID_MESSAGE, "got null"),
        (SUB % "[]", ErrorCode.INVALID_MESSAGE, "must be a JSON object (or a JSON-encoded"),
        (SUB % '"{oops"', ErrorCode.INVALID_MESSAGE, "data of pusher:subscribe is not valid"),
        (SUB % '"[1]"', ErrorCode.INVALID_MESSAGE, "got an array"),
        (SUB % "{}", ErrorCode.INVALID_CHANNEL, "pusher:subscribe needs data.channel"),
        (SUB % '{"channel":""}', ErrorCode.INVALID_CHANNEL, "channel name is empty"),
        (SUB % '{"channel":"a b"}', ErrorCode.INVALID_CHANNEL, "contains ' '"),
        (SUB % '{"channel":5}', ErrorCode.INVALID_CHANNEL, "must be a string, got int"),
        (
            SUB % '{"channel":"private-a","auth":5}',
            ErrorCode.INVALID_MESSAGE,
            "data.auth of pusher:subscribe must be a string, got a number",
        ),
        (
            SUB % '{"channel":"presence-a","channel_data":{"user_id":"1"}}',
            ErrorCode.INVALID_MESSAGE,
            "data.channel_data of pusher:subscribe must be a string, got an object",
        ),
        (
            SUB % '{"channel":"a","position":"nope"}',
            ErrorCode.INVALID_MESSAGE,
            "invalid position 'nope'",
        ),
        (SUB % '{"channel":"a","position":3}', ErrorCode.INVALID_MESSAGE, "got a number"),
        (
            SUB % '{"channel":"presence-a","auth":"k:s"}',
            ErrorCode.INVALID_CHANNEL_DATA,
            "needs channel_data",
        ),
        (
            SUB % '{"channel":"presence-a","channel_data":"{}"}',
            ErrorCode.INVALID_CHANNEL_DATA,
            "user_id must be a non-empty string or an integer, got null",
        ),
        (
            SUB % '{"channel":"presence-a","channel_data":"nope"}',
            ErrorCode.INVALID_CHANNEL_DATA,
            "channel_data is not valid JSON",
        ),
        ('{"event":"pusher:unsubscribe","data":{}}', ErrorCode.INVALID_CHANNEL, "needs data"),
        ('{"event":"pusher:bogus","data":{}}', ErrorCode.UNKNOWN_EVENT, "unknown event"),
        ('{"event":"pusher_internal:member_added"}', ErrorCode.UNKNOWN_EVENT, "unknown event"),
        ('{"event":"typing","channel":"a"}', ErrorCode.UNKNOWN_EVENT, "named 'client-*'"),
        ('{"event":"client-x","data":1}', ErrorCode.INVALID_CHANNEL, "needs a 'channel'"),
        ('{"event":"client-x","channel":"a/b"}', ErrorCode.INVALID_CHANNEL, "contains '/'"),
        (
            '{"event":"client-' + "x" * 200 + '","channel":"private-a"}',
            ErrorCode.INVALID_MESSAGE,
            "the limit is 200",
        ),
    ],
)
def test_malformed_messages_are_refused_with_a_code_and_reason(
    text: str | bytes, code: ErrorCode, fragment: str
) -> None:
    err = refused(text)
    assert err.code is code
    assert fragment in err.message
    assert not err.close


def test_oversize_messages_are_refused_before_parsing() -> None:
    err = refused('{"event":"pusher:ping","data":"' + "x" * 200 + '"}', max_size=128)
    assert err.code is ErrorCode.MESSAGE_TOO_LARGE
    assert "is 233 bytes; the limit is 128 bytes" in err.message
    assert not err.close


@pytest.mark.parametrize("event", ["pusher:" + "x" * 5000, "y" * 5000])
def test_an_unknown_event_name_is_quoted_only_as_an_excerpt(event: str) -> None:
    err = refused(orjson.dumps({"event": event, "data": {}}).decode(), max_size=20_000)
    assert err.code is ErrorCode.UNKNOWN_EVENT
    assert "characters)" in err.message
    assert len(err.message) < 400


def test_message_size_counts_utf8_bytes_not_characters() -> None:
    text = '{"event":"pusher:ping","data":"' + "é" * 60 + '"}'  # 92 chars, 152 bytes
    assert refused(text, max_size=128).code is ErrorCode.MESSAGE_TOO_LARGE
    assert parse_client_message(text, 160) == Ping()


def test_failed_subscriptions_name_their_channel() -> None:
    err = refused(SUB % '{"channel":"presence-a","auth":"k:s"}')
    assert err.channel == "presence-a"
    assert refused(SUB % '{"channel":"a b"}').channel is None


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({}, "needs data.auth and data.user_data"),
        ({"auth": "k:s", "user_data": 1}, "needs data.auth and data.user_data"),
        ({"auth": "k:s", "user_data": "{"}, "user_data of pusher:signin is not valid JSON"),
        ({"auth": "k:s", "user_data": "[]"}, "must be a JSON object, got an array"),
        ({"auth": "k:s", "user_data": '{"name":"a"}'}, 'must have an "id"'),
        ({"auth": "k:s", "user_data": '{"id":5}'}, 'must have an "id"'),
        ({"auth": "k:s", "user_data": '{"id":"' + "u" * 129 + '"}'}, "longer than 128"),
    ],
)
def test_a_bad_signin_closes_with_4009(data: dict[str, Any], fragment: str) -> None:
    err = refused(orjson.dumps({"event": "pusher:signin", "data": data}))
    assert err.code is ErrorCode.UNAUTHORIZED
    assert err.close
    assert fragment in err.message


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"event":"pusher:signin"}', "got null"),
        ('{"event":"pusher:signin","data":null}', "got null"),
        ('{"event":"pusher:signin","data":[1]}', "got an array"),
        ('{"event":"pusher:signin","data":"{oops"}', "is not valid JSON"),
        ('{"event":"pusher:signin","data":"[]"}', "got an array"),
    ],
)
def test_a_signin_without_readable_data_closes_with_4009(text: str, fragment: str) -> None:
    """A failed sign-in closes with 4009 (as Pusher does and the README says), whatever
    made it fail; it used to be a 4300 that left the connection open."""
    err = refused(text)
    assert err.code is ErrorCode.UNAUTHORIZED
    assert err.close
    assert err.message.startswith("pusher:signin failed: data of pusher:signin")
    assert fragment in err.message


# -- presence members -------------------------------------------------------------------


def test_integer_user_ids_become_strings() -> None:
    assert parse_presence_member('{"user_id":42}') == PresenceMember("42", None)


@pytest.mark.parametrize(
    ("channel_data", "fragment"),
    [
        ('{"user_id":""}', "got an empty string"),
        ('{"user_id":true}', "got a boolean"),
        ('{"user_id":1.5}', "got a number"),
        ('{"user_id":"' + "u" * 129 + '"}', "129 characters long; the limit is 128"),
        ("[]", "must be a JSON object, got an array"),
        ('{"user_id":"1","user_info":"' + "x" * 2100 + '"}', "the limit is 2048 bytes"),
    ],
)
def test_bad_channel_data_is_refused(channel_data: str, fragment: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_presence_member(channel_data)
    assert info.value.code is ErrorCode.INVALID_CHANNEL_DATA
    assert fragment in info.value.message


def test_member_size_limit_is_configurable() -> None:
    data = {"channel": "presence-a", "channel_data": '{"user_id":"12345"}'}
    text = orjson.dumps({"event": "pusher:subscribe", "data": data})
    with pytest.raises(ProtocolError) as info:
        parse_client_message(text, LIMIT, max_member_size=10)
    assert "is 19 bytes; the limit is 10 bytes" in info.value.message


# -- authorization ----------------------------------------------------------------------


def test_a_correctly_signed_private_subscription_is_authorized() -> None:
    auth = channel_auth(KEY, SECRET, "1234.1234", "private-foobar")
    authorize_subscription(APP, "1234.1234", Subscribe("private-foobar", auth=auth))


def test_public_channels_need_no_auth() -> None:
    authorize_subscription(APP, "1.1", Subscribe("agent.1"))


def test_a_missing_auth_is_a_subscription_error_on_the_channel() -> None:
    with pytest.raises(ProtocolError) as info:
        authorize_subscription(APP, "1.1", Subscribe("private-a"))
    assert info.value.code is ErrorCode.SUBSCRIPTION_UNAUTHORIZED
    assert info.value.channel == "private-a"
    assert not info.value.close
    assert "needs data.auth" in info.value.message


def test_a_wrong_auth_shows_the_string_that_should_be_signed() -> None:
    data = '{"user_id":"1"}'
    auth = channel_auth(KEY, SECRET, "1.1", "presence-a", data)
    command = Subscribe("presence-a", auth=auth, channel_data=data)
    authorize_subscription(APP, "1.1", command)
    with pytest.raises(ProtocolError) as info:
        authorize_subscription(APP, "2.2", command)
    assert 'HMAC-SHA256 of \'2.2:presence-a:{"user_id":"1"}\'' in info.value.message
    assert SECRET not in info.value.message


@pytest.mark.parametrize("channel", ["private-a", "private-encrypted-a"])
def test_channel_data_on_a_private_channel_is_refused(channel: str) -> None:
    """Even signed: ``socket:channel:data`` would let text signed for one channel
    (with a forged socket id ``<socket>:<channel>``) open another."""
    for data in ("private-b", "", '{"user_id":"1"}'):
        auth = f"{KEY}:{sign(SECRET, f'1.1:{channel}:{data}')}"
        with pytest.raises(ProtocolError) as info:
            authorize_subscription(APP, "1.1", Subscribe(channel, auth=auth, channel_data=data))
        assert info.value.code is ErrorCode.SUBSCRIPTION_UNAUTHORIZED
        assert info.value.channel == channel
        assert not info.value.close
        assert "channel_data is only for presence channels" in info.value.message


def test_a_wrong_auth_message_shows_only_an_excerpt_of_long_channel_data() -> None:
    data = '{"user_id":"1","user_info":"' + "x" * 2000 + '"}'
    command = Subscribe("presence-a", auth=f"{KEY}:{'0' * 64}", channel_data=data)
    with pytest.raises(ProtocolError) as info:
        authorize_subscription(APP, "1.1", command)
    assert "characters)" in info.value.message
    assert len(info.value.message) < 500


def test_signin_is_authorized_by_a_user_signature() -> None:
    user_data = '{"id":"u1"}'
    good = Signin(user_auth(KEY, SECRET, "1.1", user_data), user_data, SignedInUser("u1"))
    authorize_signin(APP, "1.1", good)
    with pytest.raises(ProtocolError) as info:
        authorize_signin(APP, "1.2", good)
    assert info.value.code is ErrorCode.UNAUTHORIZED
    assert info.value.close
    assert '\'1.2::user::{"id":"u1"}\'' in info.value.message


@pytest.mark.parametrize(
    ("app", "channel", "subscribed", "fragment"),
    [
        (AppConfig(id="3", key=KEY, secret=SECRET), "private-a", True, "disabled for app '3'"),
        (APP, "agent.1", True, "only allowed on private and presence channels"),
        (APP, "private-a", False, "subscribe to 'private-a' before"),
    ],
)
def test_client_events_are_rejected_unless_allowed(
    app: AppConfig, channel: str, subscribed: bool, fragment: str
) -> None:
    with pytest.raises(ProtocolError) as info:
        check_client_event(app, ClientEvent("client-x", channel, "{}"), subscribed=subscribed)
    assert info.value.code is ErrorCode.CLIENT_EVENT_REJECTED
    assert fragment in info.value.message


def test_client_events_on_joined_private_and_presence_channels_pass() -> None:
    for channel in ("private-a", "presence-a", "private-encrypted-a"):
        check_client_event(APP, ClientEvent("client-x", channel, "{}"), subscribed=True)


def test_presence_member_limit_error_names_the_channel_and_limit() -> None:
    err = presence_member_limit("presence-a", 100)
    assert err.code is ErrorCode.PRESENCE_MEMBER_LIMIT
    assert err.channel == "presence-a"
    assert "maximum of 100 members" in err.message


# -- socket ids -------------------------------------------------------------------------


def test_socket_ids_are_digits_dot_digits_and_unique() -> None:
    ids = {new_socket_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(is_valid_socket_id(i) for i in ids)


@pytest.mark.parametrize("value", ["1.2", "123456.7890"])
def test_valid_socket_ids(value: str) -> None:
    assert is_valid_socket_id(value)


@pytest.mark.parametrize(
    "value", ["", "1", "1.", ".1", "1.2.3", "a.b", "1.2\n", 1.2, None, "\u0661.\u0662"]
)
def test_invalid_socket_ids(value: object) -> None:
    assert not is_valid_socket_id(value)


# -- server frames (literal bytes) ------------------------------------------------------


def test_connection_established_frame() -> None:
    assert connection_established("1.2", 120) == (
        b'{"event":"pusher:connection_established",'
        b'"data":"{\\"socket_id\\":\\"1.2\\",\\"activity_timeout\\":120}"}'
    )


def test_ping_and_pong_frames() -> None:
    assert ping() == b'{"event":"pusher:ping","data":"{}"}'
    assert pong() == b'{"event":"pusher:pong","data":"{}"}'


def test_error_frames_carry_code_and_message_as_a_json_string() -> None:
    assert error(ErrorCode.CLIENT_EVENT_RATE_LIMIT, "slow down") == (
        b'{"event":"pusher:error","data":"{\\"code\\":4301,\\"message\\":\\"slow down\\"}"}'
    )
    assert (
        error(None, "x")
        == b'{"event":"pusher:error","data":"{\\"code\\":null,\\"message\\":\\"x\\"}"}'
    )


def test_subscription_succeeded_for_a_plain_channel() -> None:
    assert subscription_succeeded("agent.1") == (
        b'{"event":"pusher_internal:subscription_succeeded","data":"{}","channel":"agent.1"}'
    )


def test_subscription_succeeded_for_presence_lists_members() -> None:
    frame = orjson.loads(subscription_succeeded("presence-a", {"1": {"n": "a"}, "2": None}))
    assert frame["event"] == "pusher_internal:subscription_succeeded"
    assert frame["channel"] == "presence-a"
    assert orjson.loads(frame["data"]) == {
        "presence": {"ids": ["1", "2"], "hash": {"1": {"n": "a"}, "2": None}, "count": 2}
    }


def test_subscription_error_is_channel_scoped() -> None:
    frame = orjson.loads(
        subscription_error("private-a", "bad auth", code=ErrorCode.SUBSCRIPTION_UNAUTHORIZED)
    )
    assert frame["event"] == "pusher:subscription_error"
    assert frame["channel"] == "private-a"
    assert orjson.loads(frame["data"]) == {
        "type": "AuthError",
        "error": "bad auth",
        "status": 401,
        "code": 4009,
    }


def test_member_frames() -> None:
    assert member_added("presence-a", "1", {"n": "a"}) == (
        b'{"event":"pusher_internal:member_added",'
        b'"data":"{\\"user_id\\":\\"1\\",\\"user_info\\":{\\"n\\":\\"a\\"}}","channel":"presence-a"}'
    )
    assert member_removed("presence-a", "1") == (
        b'{"event":"pusher_internal:member_removed","data":"{\\"user_id\\":\\"1\\"}",'
        b'"channel":"presence-a"}'
    )


def test_subscription_count_frame() -> None:
    frame = orjson.loads(subscription_count("a", 3))
    assert frame == {
        "event": "pusher_internal:subscription_count",
        "data": '{"subscription_count":3}',
        "channel": "a",
    }


def test_signin_success_echoes_user_data_text() -> None:
    assert signin_success('{"id":"u1"}') == (
        b'{"event":"pusher:signin_success","data":"{\\"user_data\\":\\"{\\\\\\"id\\\\\\":\\\\\\"u1\\\\\\"}\\"}"}'
    )


def test_channel_event_frame_with_and_without_extensions() -> None:
    assert channel_event("agent.step", "agent.1", '{"a":1}') == (
        b'{"event":"agent.step","channel":"agent.1","data":"{\\"a\\":1}"}'
    )
    assert channel_event(
        "client-x", "presence-a", "hi", user_id="7", position=Position(5, "e")
    ) == (b'{"event":"client-x","channel":"presence-a","data":"hi","user_id":"7","position":"e:5"}')


def test_resume_result_frame() -> None:
    frame = orjson.loads(resume_result("agent.1", False, Position(9, "e2"), reason="epoch changed"))
    assert frame["event"] == RESUME_EVENT == "broadcaster:resume"
    assert frame["channel"] == "agent.1"
    assert orjson.loads(frame["data"]) == {
        "recovered": False,
        "position": "e2:9",
        "reason": "epoch changed",
    }
    empty = orjson.loads(resume_result("agent.1", True, None))
    assert orjson.loads(empty["data"]) == {"recovered": True, "position": None}


# -- fuzzing ----------------------------------------------------------------------------

# JSON values as orjson parses them: 64-bit integers, finite floats.
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
event_names = (
    st.sampled_from(
        [
            "pusher:subscribe",
            "pusher:unsubscribe",
            "pusher:ping",
            "pusher:pong",
            "pusher:signin",
            "client-x",
            "pusher:other",
            "other",
        ]
    )
    | st.text()
)
channels = st.sampled_from(["agent.1", "private-a", "presence-a", "", "a b"]) | st.text()
messages = st.fixed_dictionaries(
    {"event": event_names},
    optional={
        "channel": channels | json_values,
        "data": json_values
        | st.fixed_dictionaries(
            {"channel": channels},
            optional={
                "auth": st.text() | json_values,
                "channel_data": st.text() | json_values.map(lambda v: json.dumps(v)),
                "position": st.text() | json_values,
                "user_data": st.text() | json_values.map(lambda v: json.dumps(v)),
            },
        ),
    },
)


def _parse_or_refuse(text: str | bytes) -> None:
    outcome: Command | ProtocolError
    try:
        outcome = parse_client_message(text, 2_000)
    except ProtocolError as exc:
        outcome = exc
    if isinstance(outcome, ProtocolError):
        assert isinstance(outcome.code, ErrorCode)
        assert outcome.message
    else:
        assert isinstance(outcome, Subscribe | Unsubscribe | Ping | Pong | Signin | ClientEvent)


@settings(max_examples=150)
@given(st.text() | st.binary())
def test_arbitrary_input_gives_a_command_or_a_protocol_error(text: str | bytes) -> None:
    _parse_or_refuse(text)


@settings(max_examples=200)
@given(messages, st.booleans())
def test_message_shaped_input_gives_a_command_or_a_protocol_error(
    message: dict[str, Any], data_as_string: bool
) -> None:
    if data_as_string and "data" in message:
        message = {**message, "data": json.dumps(message["data"])}
    _parse_or_refuse(json.dumps(message))


@settings(max_examples=150)
@given(st.text(), st.text(), st.text(), st.text(), json_values)
def test_frames_are_valid_json_that_round_trips(
    event: str, channel: str, data: str, user_id: str, info: Any
) -> None:
    frame = orjson.loads(channel_event(event, channel, data, user_id, Position(1, "e")))
    assert frame == {
        "event": event,
        "channel": channel,
        "data": data,
        "user_id": user_id,
        "position": "e:1",
    }
    added = orjson.loads(member_added(channel, user_id, info))
    assert orjson.loads(added["data"]) == {"user_id": user_id, "user_info": info}
    err = orjson.loads(error(4300, data))
    assert orjson.loads(err["data"]) == {"code": 4300, "message": data}
    hashed = orjson.loads(orjson.loads(subscription_succeeded(channel, {user_id: info}))["data"])
    assert hashed["presence"] == {"ids": [user_id], "hash": {user_id: info}, "count": 1}


@pytest.mark.parametrize("size", [300, 8000])
def test_frames_weigh_their_size(size: int) -> None:
    """A frame waiting in a queue weighs what max_buffer_bytes counts: orjson's output
    buffer (about 4 KB for 300 bytes, 64 KB for 8 KB) is not kept."""
    data = "x" * size
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        frames = [
            *(protocol.channel_event("e", "agent.s", data, position=f"ab:{i}") for i in range(200)),
            *(protocol.subscription_error("agent.s", data) for _ in range(200)),
        ]
        per_frame = (tracemalloc.get_traced_memory()[0] - before) / len(frames)
    finally:
        tracemalloc.stop()
    longest = max(len(frame) for frame in frames)
    assert per_frame < longest + 200, f"{per_frame:.0f} bytes per frame of {longest}"


def test_an_exact_copy_is_a_new_equal_object() -> None:
    data = orjson.dumps({"a": "b"})
    copy = protocol.exact(data)
    assert copy == data
    assert copy is not data


def test_a_position_made_fast_is_a_position_like_any_other() -> None:
    position = make_position(7, "abcdefgh")
    assert type(position) is Position
    assert position == Position(7, "abcdefgh")
    assert hash(position) == hash(Position(7, "abcdefgh"))
    assert str(position) == "abcdefgh:7"
    with pytest.raises(AttributeError):
        position.offset = 8  # type: ignore[misc]


def test_a_publication_made_fast_is_a_publication_like_any_other() -> None:
    for exclude in (None, "1.2"):
        made = make_publication("app", "chat", "ev", "{}", exclude)
        plain = Publication("app", "chat", "ev", "{}", exclude)
        assert type(made) is Publication
        assert made == plain
        assert hash(made) == hash(plain)
        assert made.user_id is None
        assert made.position is None
    with pytest.raises(AttributeError):
        made.channel = "other"  # type: ignore[misc]
