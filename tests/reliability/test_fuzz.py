"""Property-based fuzzing of the protocol core beyond tests/broadcaster: whatever a
client or an HTTP caller sends, the sans-I/O functions either return a value or raise
their documented error (ProtocolError with a code, ApiError with a status), never any
other exception; what parses is then authorised without surprises."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broadcaster import protocol
from broadcaster.codes import ErrorCode
from broadcaster.exceptions import ApiError, ProtocolError
from broadcaster.http_models import parse_batch, parse_info, parse_trigger
from broadcaster.publication import Position
from broadcaster.settings import AppConfig
from broadcaster.signing import channel_auth, verify_request
from tests.support.reliability import report

APP = AppConfig(id="1", key="agent-key", secret="agent-secret", enable_client_messages=True)
SOCKET = "123.456"
TRIED: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def _report_counts() -> Iterator[None]:
    """After the module: the number of generated inputs, for the README."""
    yield
    if TRIED:
        report("fuzz", generated_inputs=sum(TRIED.values()), **dict(TRIED))


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=15,
)
channel_names = st.sampled_from(
    ["agent.1", "private-a", "presence-a", "private-encrypted-a", "#server-to-user-7", "", "a b"]
) | st.text(max_size=170)
events = st.sampled_from(
    ["pusher:subscribe", "pusher:unsubscribe", "pusher:signin", "pusher:ping", "client-x"]
) | st.text(max_size=20)


@st.composite
def subscriptions(draw: st.DrawFn) -> dict[str, Any]:
    """Subscribe messages with plausible and forged auth, channel_data and positions."""
    channel = draw(channel_names)
    data: dict[str, Any] = {"channel": channel}
    channel_data = draw(st.none() | st.text(max_size=30) | json_values.map(json.dumps))
    if channel_data is not None:
        data["channel_data"] = channel_data
    auth_kind = draw(st.sampled_from(["valid", "other-socket", "other-key", "junk", "none"]))
    if auth_kind == "valid" and isinstance(channel, str):
        data["auth"] = channel_auth("agent-key", "agent-secret", SOCKET, channel, channel_data)
    elif auth_kind == "other-socket" and isinstance(channel, str):
        data["auth"] = channel_auth("agent-key", "agent-secret", "9.9", channel, channel_data)
    elif auth_kind == "other-key" and isinstance(channel, str):
        data["auth"] = channel_auth("other", "agent-secret", SOCKET, channel, channel_data)
    elif auth_kind == "junk":
        data["auth"] = draw(json_values)
    position = draw(st.none() | st.text(max_size=20) | json_values | st.just("e:12"))
    if position is not None:
        data["position"] = position
    as_string = draw(st.booleans())
    return {"event": "pusher:subscribe", "data": json.dumps(data) if as_string else data}


def nested(depth: int, opener: str) -> str:
    """JSON text of arrays or objects nested ``depth`` levels deep."""
    if opener == "{":
        return '{"a":' * depth + "1" + "}" * depth
    return "[" * depth + "]" * depth


def attempt(
    call: Callable[[], object], errors: type[Exception] | tuple[type[Exception], ...]
) -> Exception | None:
    """Run ``call``; the documented error it raised, if any (others propagate)."""
    try:
        call()
    except errors as exc:
        return exc
    return None


def check_command(raw: str | bytes, max_size: int = 10_240) -> None:
    """Parse; a command is then authorised as the node would, with only documented
    errors."""
    TRIED["frames"] += 1
    refused: ProtocolError | None = None
    try:
        command = protocol.parse_client_message(raw, max_size)
    except ProtocolError as exc:
        refused = exc
    if refused is not None:
        assert isinstance(refused.code, ErrorCode)
        assert refused.message
        assert refused.close == (refused.code is ErrorCode.UNAUTHORIZED and refused.channel is None)
        return
    error = attempt(lambda: authorize(command), ProtocolError)
    if isinstance(error, ProtocolError):
        assert error.code in (
            ErrorCode.SUBSCRIPTION_UNAUTHORIZED,
            ErrorCode.UNAUTHORIZED,
            ErrorCode.CLIENT_EVENT_REJECTED,
        ), error


def authorize(command: protocol.Command) -> None:
    """What the node checks and sends after parsing."""
    match command:
        case protocol.Subscribe():
            if command.member is not None:  # what the node sends about the member
                member = command.member
                protocol.subscription_succeeded(command.channel, {"1": member.user_info})
                protocol.member_added(command.channel, member.user_id, member.user_info)
            protocol.authorize_subscription(APP, SOCKET, command)
        case protocol.Signin():
            protocol.authorize_signin(APP, SOCKET, command)
        case protocol.ClientEvent():
            protocol.check_client_event(APP, command, subscribed=True)
        case protocol.Unsubscribe() | protocol.Ping() | protocol.Pong():
            pass


@settings(max_examples=200)
@given(subscriptions())
def test_subscriptions_with_forged_or_replayed_auth_are_refused_cleanly(
    message: dict[str, Any],
) -> None:
    check_command(json.dumps(message))


@settings(max_examples=150)
@given(
    st.fixed_dictionaries(
        {"event": events},
        optional={"channel": channel_names | json_values, "data": json_values},
    ),
    st.sampled_from(["text", "utf8-bytes", "latin1-bytes"]),
)
def test_arbitrary_frames_as_text_or_binary(message: dict[str, Any], encoding: str) -> None:
    text = json.dumps(message, ensure_ascii=False)
    if encoding == "text":
        check_command(text)
    elif encoding == "utf8-bytes":
        check_command(text.encode("utf-8", "surrogatepass"))
    else:
        check_command(text.encode("latin-1", "replace"))


@settings(max_examples=100)
@given(st.integers(min_value=1, max_value=5_000), st.sampled_from(["[", "{"]), st.booleans())
def test_deeply_nested_json_is_refused_or_parsed_never_crashes(
    depth: int, opener: str, in_data: bool
) -> None:
    value = nested(depth, opener)
    if in_data:
        check_command('{"event":"pusher:subscribe","data":' + json.dumps(value) + "}", 1 << 20)
    else:
        check_command('{"event":"client-x","channel":"private-a","data":' + value + "}", 1 << 20)


@settings(max_examples=100)
@given(st.integers(min_value=0, max_value=400), st.sampled_from(["[", "{"]))
def test_presence_members_with_deep_user_info_are_refused_or_sendable(
    depth: int, opener: str
) -> None:
    channel_data = '{"user_id":"u","user_info":' + nested(depth, opener) + "}"
    data = {"channel": "presence-a", "channel_data": channel_data}
    check_command(json.dumps({"event": "pusher:subscribe", "data": data}), 1 << 20)


@settings(max_examples=100)
@given(st.binary(max_size=300), st.integers(min_value=1, max_value=400))
def test_arbitrary_bytes_within_and_over_the_size_limit(raw: bytes, limit: int) -> None:
    check_command(raw, limit)


queries = st.dictionaries(
    st.sampled_from(
        ["auth_key", "auth_timestamp", "auth_version", "auth_signature", "body_md5", "x"]
    ),
    st.text(max_size=70),
    max_size=6,
)


@settings(max_examples=150)
@given(queries, st.binary(max_size=100), st.sampled_from(["GET", "POST"]), st.text(max_size=30))
def test_http_signatures_are_verified_or_refused_with_401(
    query: dict[str, str], body: bytes, method: str, path: str
) -> None:
    TRIED["http_signatures"] += 1
    error = attempt(lambda: verify_request(APP, method, path, query, body, 1_700_000_000), ApiError)
    if isinstance(error, ApiError):
        assert error.status == 401
        assert error.body()["error"]


bodies = st.fixed_dictionaries(
    {},
    optional={
        "name": json_values | st.text(max_size=210),
        "data": json_values | st.text(max_size=50),
        "channel": channel_names | json_values,
        "channels": st.lists(channel_names, max_size=110) | json_values,
        "socket_id": st.sampled_from(["1.2", "x", ""]) | json_values,
        "info": st.sampled_from(["user_count", "subscription_count", "bogus"]) | json_values,
    },
)


@settings(max_examples=150)
@given(
    bodies | json_values,
    st.lists(bodies | json_values, max_size=13),
    st.binary(max_size=60),
    st.text(max_size=40),
)
def test_http_bodies_parse_or_give_400_or_413(
    body: Any, batch: list[Any], raw: bytes, info: str
) -> None:
    TRIED["http_bodies"] += 1
    cases: list[tuple[Callable[[bytes, AppConfig], object], bytes]] = [
        (parse_trigger, json.dumps(body).encode()),
        (parse_batch, json.dumps({"batch": batch}).encode()),
        (parse_trigger, raw),
        (parse_batch, raw),
    ]
    for parse, content in cases:
        error = attempt(partial(parse, content, APP), ApiError)
        if isinstance(error, ApiError):
            assert error.status in (400, 413), error
    error = attempt(lambda: parse_info(info), ApiError)
    if isinstance(error, ApiError):
        assert error.status == 400


@settings(max_examples=100)
@given(st.text(max_size=40))
def test_positions_parse_or_say_what_is_wrong(text: str) -> None:
    TRIED["positions"] += 1
    error = attempt(lambda: Position.parse(text), ValueError)
    if error is None:
        position = Position.parse(text)
        assert Position.parse(str(position)) == position
    else:
        assert "invalid position" in str(error)
