"""The Pusher protocol (version 7) as a sans-I/O core: text in, commands out, bytes to send.

:func:`parse_client_message` turns one WebSocket text message into a typed command or
raises :class:`~broadcaster.exceptions.ProtocolError` with the code to send and a
message saying what is wrong. The frame builders return the JSON text, as ``bytes``, of
each server message. Nothing here awaits, reads a clock or touches a socket; the
WebSocket endpoint is a shell around it.

Wire rules followed here: every message is ``{"event", "channel"?, "data"}``; for
``pusher:*`` and ``pusher_internal:*`` events the server sends ``data`` as a JSON-encoded
string, and accepts from clients either that or a JSON object (pusher-js sends objects).

Our extensions, which other Pusher servers and pusher-js ignore:

- ``pusher:subscribe`` may carry ``"position": "<epoch>:<offset>"``: the last position the
  client saw on the channel, asking to resume from it (:attr:`Subscribe.resume_from`).
- Channel events carry a top-level ``"position"`` when the channel keeps history.
- ``broadcaster:resume`` (:data:`RESUME_EVENT`, on the channel) answers a resume request
  with ``{"recovered": true|false, "position": "<epoch>:<offset>"|null, "reason"?}``:
  ``recovered`` true means every missed publication has been sent (before this event) in
  order; false means the gap could not be filled (history expired or the epoch changed)
  and the client must reload the state instead (for agent sessions: the reconcile
  endpoint), then continue from ``position``.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeAlias

import orjson

from broadcaster._text import excerpt
from broadcaster.channels import (
    ChannelKind,
    channel_kind,
    is_client_event,
    validate_channel_name,
)
from broadcaster.codes import ErrorCode
from broadcaster.exceptions import ProtocolError
from broadcaster.origins import origin_allowed
from broadcaster.publication import (
    Position,
    PresenceMember,
    Publication,
    channel_event_frame,
    parse_channel_event,
)
from broadcaster.signing import (
    AppCredentials,
    channel_string_to_sign,
    is_valid_socket_id,
    user_string_to_sign,
    verify_channel_auth,
    verify_user_auth,
)

__all__ = [
    "DEFAULT_MAX_MEMBER_SIZE",
    "MAX_EVENT_NAME_LENGTH",
    "MAX_USER_ID_LENGTH",
    "MAX_USER_INFO_DEPTH",
    "MEMBER_ADDED",
    "MEMBER_REMOVED",
    "PROTOCOL_VERSION",
    "RESUME_EVENT",
    "AppRules",
    "ClientEvent",
    "Command",
    "Notice",
    "Ping",
    "Pong",
    "PresenceMember",
    "SignedInUser",
    "Signin",
    "Subscribe",
    "Unsubscribe",
    "authorize_signin",
    "authorize_subscription",
    "channel_event",
    "check_channel_limit",
    "check_client_event",
    "check_origin",
    "check_protocol_version",
    "connection_established",
    "error",
    "exact",
    "is_valid_socket_id",
    "member_added",
    "member_added_notice",
    "member_removed",
    "member_removed_notice",
    "new_socket_id",
    "parse_client_message",
    "parse_presence_member",
    "parse_user_data",
    "ping",
    "pong",
    "presence_member_limit",
    "resume_result",
    "signin_success",
    "subscription_count",
    "subscription_error",
    "subscription_succeeded",
]

PROTOCOL_VERSION = 7
"""The Pusher protocol version served (pusher-js 7 and 8 speak it)."""
RESUME_EVENT = "broadcaster:resume"
MEMBER_ADDED = "pusher_internal:member_added"
MEMBER_REMOVED = "pusher_internal:member_removed"
MAX_EVENT_NAME_LENGTH = 200
MAX_USER_ID_LENGTH = 128
DEFAULT_MAX_MEMBER_SIZE = 2_048
MAX_USER_INFO_DEPTH = 32
"""Deepest nesting of a presence member's ``user_info`` (it is re-sent inside frames)."""

_CLIENT_COMMANDS = (
    "pusher:subscribe, pusher:unsubscribe, pusher:ping, pusher:pong, pusher:signin "
    "and client-* events"
)


# -- commands ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SignedInUser:
    """The user of a ``pusher:signin``: ``id`` and the rest of ``user_data``."""

    id: str
    user_info: Any = None


@dataclass(frozen=True, slots=True)
class Subscribe:
    """``pusher:subscribe``: join ``channel``.

    ``auth`` and ``channel_data`` are as sent (checked by :func:`authorize_subscription`);
    ``member`` is the parsed ``channel_data`` of a presence subscription; ``resume_from``
    is our extension, the position to resume from.
    """

    EVENT: ClassVar[str] = "pusher:subscribe"
    channel: str
    auth: str | None = None
    channel_data: str | None = None
    resume_from: Position | None = None
    member: PresenceMember | None = None

    @property
    def kind(self) -> ChannelKind:
        """The kind of the channel."""
        return channel_kind(self.channel)


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """``pusher:unsubscribe``: leave ``channel``."""

    EVENT: ClassVar[str] = "pusher:unsubscribe"
    channel: str


@dataclass(frozen=True, slots=True)
class Ping:
    """``pusher:ping``: answer with :func:`pong`."""

    EVENT: ClassVar[str] = "pusher:ping"


@dataclass(frozen=True, slots=True)
class Pong:
    """``pusher:pong``: the answer to the server's :func:`ping`."""

    EVENT: ClassVar[str] = "pusher:pong"


@dataclass(frozen=True, slots=True)
class Signin:
    """``pusher:signin``: authenticate the connection as a user.

    ``user_data`` is the JSON text as signed; ``user`` is its parsed form.
    """

    EVENT: ClassVar[str] = "pusher:signin"
    auth: str
    user_data: str
    user: SignedInUser


@dataclass(frozen=True, slots=True)
class ClientEvent:
    """A ``client-*`` event to relay to the other subscribers of ``channel``.

    ``data`` is text: the string the client sent, or the JSON text of any other value.
    """

    event: str
    channel: str
    data: str


Command: TypeAlias = Subscribe | Unsubscribe | Ping | Pong | Signin | ClientEvent
"""A parsed client message; dispatch with ``match`` and end with ``assert_never``."""


# -- parsing ----------------------------------------------------------------------------


def parse_client_message(
    text: str | bytes, max_size: int, *, max_member_size: int = DEFAULT_MAX_MEMBER_SIZE
) -> Command:
    """Parse one client message.

    Args:
        text: the WebSocket message; ``bytes`` (a binary frame) must be UTF-8 text.
        max_size: the largest message accepted, in bytes (the app's ``max_message_size``).
        max_member_size: the largest presence ``channel_data``, in bytes.

    Returns:
        The command.

    Raises:
        ProtocolError: saying what is wrong; ``close`` is set only for ``pusher:signin``
            failures (4009), every other error leaves the connection usable.
    """
    message = _decode_message(text, max_size)
    event = message.get("event")
    if not isinstance(event, str):
        raise _invalid(f"'event' must be a string, got {_type_name(event)}")
    if event == "pusher:subscribe":
        return _parse_subscribe(_pusher_data(message, event), max_member_size)
    parse = _PUSHER_PARSERS.get(event)
    if parse is not None:
        return parse(message)
    if is_client_event(event):
        return _parse_client_event(message, event)
    raise _unknown_event(event)


def _decode_message(text: str | bytes, max_size: int) -> dict[str, Any]:
    size = _byte_size(text, max_size)
    if size > max_size:
        raise ProtocolError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"message is {size} bytes; the limit is {max_size} bytes",
        )
    if isinstance(text, bytes):
        text = _utf8(text)
    value = _loads(text, "message")
    if not isinstance(value, dict):
        raise _invalid(
            f'message must be a JSON object like {{"event": ..., "data": ...}}, '
            f"got {_type_name(value)}"
        )
    return value


def _byte_size(text: str | bytes, max_size: int) -> int:
    if isinstance(text, bytes) or len(text) > max_size or len(text) * 4 <= max_size:
        return len(text)  # a str longer than max_size is too large whatever its bytes
    return len(text.encode("utf-8", "surrogatepass"))


def _utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(f"binary message is not UTF-8 text ({exc.reason})") from None


def _loads(text: str, what: str, code: ErrorCode = ErrorCode.INVALID_MESSAGE) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        reason = str(exc)
        if "depth limit" in reason or "recursion" in reason:
            reason = "JSON nested deeper than 1024 levels"
        elif "surrogates" in reason:
            reason = "not valid UTF-8 text (lone surrogate)"
        raise ProtocolError(code, f"{what} is not valid JSON: {reason}") from None


def _pusher_data(message: dict[str, Any], event: str) -> dict[str, Any]:
    data = message.get("data")
    if isinstance(data, str):
        data = _loads(data, f"data of {event}")
    if not isinstance(data, dict):
        raise _invalid(
            f"data of {event} must be a JSON object (or a JSON-encoded object string), "
            f"got {_type_name(data)}"
        )
    return data


def _parse_subscribe(data: dict[str, Any], max_member_size: int) -> Subscribe:
    channel = _channel_of(data, "pusher:subscribe")
    auth = _optional_str(data, "auth", "pusher:subscribe", channel)
    channel_data = _optional_str(data, "channel_data", "pusher:subscribe", channel)
    resume_from = _position(data.get("position"), channel)
    member = None
    if channel_kind(channel) is ChannelKind.PRESENCE:
        if channel_data is None:
            raise ProtocolError(
                ErrorCode.INVALID_CHANNEL_DATA,
                f"subscribing to presence channel {channel!r} needs channel_data: a "
                'JSON-encoded object like {"user_id": "42", "user_info": {...}}, '
                "signed in auth",
                channel=channel,
            )
        member = _with_channel(parse_presence_member, channel, channel_data, max_member_size)
    return Subscribe(channel, auth, channel_data, resume_from, member)


def _parse_unsubscribe(message: dict[str, Any]) -> Unsubscribe:
    data = _pusher_data(message, "pusher:unsubscribe")
    return Unsubscribe(_channel_of(data, "pusher:unsubscribe"))


def _parse_ping(message: dict[str, Any]) -> Ping:
    return Ping()  # clients send {}, "{}", "" or nothing as data: all fine


def _parse_pong(message: dict[str, Any]) -> Pong:
    return Pong()


def _parse_signin(message: dict[str, Any]) -> Signin:
    try:
        data = _pusher_data(message, "pusher:signin")
    except ProtocolError as exc:  # a sign-in that cannot be read has failed: 4009
        raise _signin_error(f"pusher:signin failed: {exc.message}") from None
    auth = data.get("auth")
    user_data = data.get("user_data")
    if not isinstance(auth, str) or not isinstance(user_data, str):
        raise _signin_error(
            "pusher:signin needs data.auth and data.user_data, both strings "
            "(from your user authentication endpoint)"
        )
    return Signin(auth, user_data, parse_user_data(user_data))


def _parse_client_event(message: dict[str, Any], event: str) -> ClientEvent:
    if len(event) > MAX_EVENT_NAME_LENGTH:
        raise _invalid(
            f"event name is {len(event)} characters long; the limit is {MAX_EVENT_NAME_LENGTH}"
        )
    if "channel" not in message:
        raise ProtocolError(
            ErrorCode.INVALID_CHANNEL, f"client event {excerpt(event)} needs a 'channel'"
        )
    channel = validate_channel_name(message["channel"])
    data = message.get("data")
    try:
        text = data if isinstance(data, str) else orjson.dumps(data).decode()
    except TypeError:  # orjson writes at most 254 levels (it reads 1024)
        raise _invalid(
            f"data of {excerpt(event)} is nested too deeply (more than 254 levels)"
        ) from None
    return ClientEvent(event, channel, text)


_PUSHER_PARSERS: dict[str, Callable[[dict[str, Any]], Command]] = {
    "pusher:unsubscribe": _parse_unsubscribe,
    "pusher:ping": _parse_ping,
    "pusher:pong": _parse_pong,
    "pusher:signin": _parse_signin,
}


def _channel_of(data: dict[str, Any], event: str) -> str:
    if "channel" not in data:
        raise ProtocolError(ErrorCode.INVALID_CHANNEL, f"{event} needs data.channel")
    return validate_channel_name(data["channel"])


def _optional_str(data: dict[str, Any], field: str, event: str, channel: str) -> str | None:
    value = data.get(field)
    if value is None or isinstance(value, str):
        return value
    raise _invalid(
        f"data.{field} of {event} must be a string, got {_type_name(value)}", channel=channel
    )


def _position(value: object, channel: str) -> Position | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return Position.parse(value)
        except ValueError as exc:
            raise _invalid(f"data.position: {exc}", channel=channel) from None
    raise _invalid(
        f"data.position must be a string '<epoch>:<offset>', got {_type_name(value)}",
        channel=channel,
    )


def _with_channel(
    parse: Callable[[str, int], PresenceMember], channel: str, text: str, limit: int
) -> PresenceMember:
    try:
        return parse(text, limit)
    except ProtocolError as exc:
        raise ProtocolError(exc.code, exc.message, channel=channel) from None


def _unknown_event(event: str) -> ProtocolError:
    if event.startswith(("pusher:", "pusher_internal:")):
        message = f"unknown event {excerpt(event)}: clients may send {_CLIENT_COMMANDS}"
    else:
        message = (
            f"event {excerpt(event)} is not a client event: events sent by clients must be "
            f"named 'client-*' (clients may send {_CLIENT_COMMANDS})"
        )
    return ProtocolError(ErrorCode.UNKNOWN_EVENT, message)


def _invalid(message: str, *, channel: str | None = None) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_MESSAGE, message, channel=channel)


def _signin_error(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.UNAUTHORIZED, message, close=True)


def _type_name(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number" if isinstance(value, int | float) else "?")


# -- presence and users -----------------------------------------------------------------


def parse_presence_member(
    channel_data: str, max_size: int = DEFAULT_MAX_MEMBER_SIZE
) -> PresenceMember:
    """Parse a presence subscription's ``channel_data``.

    Args:
        channel_data: JSON text of an object with ``user_id`` (a non-empty string or an
            integer, at most 128 characters) and optional ``user_info``.
        max_size: the largest ``channel_data`` accepted, in bytes.

    Raises:
        ProtocolError: ``INVALID_CHANNEL_DATA`` saying what is wrong.
    """
    size = len(channel_data.encode("utf-8", "surrogatepass"))
    if size > max_size:
        raise _bad_member(f"channel_data is {size} bytes; the limit is {max_size} bytes")
    value = _loads(channel_data, "channel_data", ErrorCode.INVALID_CHANNEL_DATA)
    if not isinstance(value, dict):
        raise _bad_member(f"channel_data must be a JSON object, got {_type_name(value)}")
    user_info = value.get("user_info")
    if _nesting(user_info) > MAX_USER_INFO_DEPTH:
        raise _bad_member(
            f"channel_data.user_info is nested more than {MAX_USER_INFO_DEPTH} levels deep"
        )
    return PresenceMember(_user_id(value.get("user_id")), user_info)


def _nesting(value: object) -> int:
    """How deeply arrays and objects are nested in ``value`` (0 for a scalar)."""
    deepest, level = 0, [(value, 1)]
    while level:
        item, depth = level.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            children = item.values() if isinstance(item, dict) else item
            level.extend((child, depth + 1) for child in children)
    return deepest


def _user_id(value: object) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value:
        raise _bad_member(
            f"channel_data.user_id must be a non-empty string or an integer, "
            f"got {_type_name(value) if value != '' else 'an empty string'}"
        )
    if len(value) > MAX_USER_ID_LENGTH:
        raise _bad_member(
            f"channel_data.user_id is {len(value)} characters long; "
            f"the limit is {MAX_USER_ID_LENGTH}"
        )
    return value


def _bad_member(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_CHANNEL_DATA, message)


def parse_user_data(user_data: str) -> SignedInUser:
    """Parse the ``user_data`` of a ``pusher:signin``: a JSON object with a non-empty
    string ``id`` (and optional ``user_info``, ``watchlist``).

    Raises:
        ProtocolError: ``UNAUTHORIZED`` with ``close`` set (a failed sign-in closes the
            connection with 4009, as Pusher does).
    """
    try:
        value = orjson.loads(user_data)
    except orjson.JSONDecodeError:
        raise _signin_error("user_data of pusher:signin is not valid JSON") from None
    if not isinstance(value, dict):
        raise _signin_error(f"user_data must be a JSON object, got {_type_name(value)}")
    user_id = value.get("id")
    if not isinstance(user_id, str) or not user_id:
        raise _signin_error('user_data must have an "id": a non-empty string')
    if len(user_id) > MAX_USER_ID_LENGTH:
        raise _signin_error(f"user_data.id is longer than {MAX_USER_ID_LENGTH} characters")
    return SignedInUser(user_id, value.get("user_info"))


# -- authorization (pure: the app's credentials in, an error or nothing out) ------------


class AppRules(AppCredentials, Protocol):
    """What the protocol checks of an app, as plain values (the server's ``AppConfig``
    has them; this module does not import the server's settings)."""

    @property
    def enable_client_messages(self) -> bool: ...
    @property
    def allowed_origins(self) -> Sequence[str]: ...
    @property
    def max_channels_per_connection(self) -> int: ...


def authorize_subscription(app: AppCredentials, socket_id: str, command: Subscribe) -> None:
    """Check the ``auth`` of a subscription to a private or presence channel.

    Public channels need nothing. For the others, ``auth`` must be ``"<app key>:<hex
    HMAC-SHA256>"`` of ``socket_id:channel``, plus ``:channel_data`` for a presence
    channel. ``channel_data`` is refused on a private channel: were it part of the
    signed text there, a signature of ``<socket>:<other channel>:<own channel>`` (made
    for the own channel with a forged socket id) would open the other channel.

    Raises:
        ProtocolError: ``SUBSCRIPTION_UNAUTHORIZED`` with ``channel`` set; send it as
            :func:`subscription_error` (the connection stays open).
    """
    if not command.kind.needs_auth:
        return
    channel = command.channel
    if command.auth is None:
        raise _unauthorized(
            channel,
            f"subscribing to {command.kind.value} channel {channel!r} needs data.auth "
            "from your channel authorization endpoint",
        )
    if command.kind is ChannelKind.PRIVATE and command.channel_data is not None:
        raise _unauthorized(
            channel,
            f"channel_data is only for presence channels: the auth of private channel "
            f"{channel!r} signs '<socket_id>:{channel}' alone; send no channel_data",
        )
    if not verify_channel_auth(
        app.key, app.secret, command.auth, socket_id, channel, command.channel_data
    ):
        signed = channel_string_to_sign(socket_id, channel, command.channel_data)
        raise _unauthorized(
            channel,
            f"invalid auth for channel {channel!r}: expected '<app key>:' and the hex "
            f"HMAC-SHA256 of {excerpt(signed, 256)} under the app secret",
        )


def _unauthorized(channel: str, message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.SUBSCRIPTION_UNAUTHORIZED, message, channel=channel, close=False)


def authorize_signin(app: AppCredentials, socket_id: str, command: Signin) -> None:
    """Check the ``auth`` of a ``pusher:signin``.

    Raises:
        ProtocolError: ``UNAUTHORIZED`` with ``close`` set (Pusher closes with 4009).
    """
    if not verify_user_auth(app.key, app.secret, command.auth, socket_id, command.user_data):
        signed = user_string_to_sign(socket_id, command.user_data)
        raise _signin_error(
            f"invalid pusher:signin auth: expected '<app key>:' and the hex HMAC-SHA256 "
            f"of {excerpt(signed, 256)} under the app secret"
        )


def check_client_event(app: AppRules, command: ClientEvent, *, subscribed: bool) -> None:
    """Check that a client event may be relayed.

    Args:
        app: the connection's app.
        command: the client event.
        subscribed: whether the sending connection is subscribed to the channel.

    Raises:
        ProtocolError: ``CLIENT_EVENT_REJECTED`` if client events are disabled for the
            app, the channel is public, or the sender has not joined it.
    """
    channel = command.channel
    if not app.enable_client_messages:
        reason = f"client events are disabled for app {app.id!r}"
    elif not channel_kind(channel).needs_auth:
        reason = f"client events are only allowed on private and presence channels, not {channel!r}"
    elif not subscribed:
        reason = f"subscribe to {channel!r} before sending client events on it"
    else:
        return
    raise ProtocolError(
        ErrorCode.CLIENT_EVENT_REJECTED, f"{excerpt(command.event)} rejected: {reason}"
    )


def presence_member_limit(channel: str, limit: int) -> ProtocolError:
    """The error for a subscription to a presence channel that has ``limit`` members."""
    return ProtocolError(
        ErrorCode.PRESENCE_MEMBER_LIMIT,
        f"presence channel {channel!r} is full: it has the maximum of {limit} members",
        channel=channel,
    )


# -- socket ids -------------------------------------------------------------------------


def new_socket_id() -> str:
    """A fresh socket id, ``"<digits>.<digits>"``, from a cryptographically secure source."""
    return f"{secrets.randbelow(10**10)}.{secrets.randbelow(10**10)}"


# -- server frames ----------------------------------------------------------------------


# -- admission checks ------------------------------------------------------------------


def check_origin(app: AppRules, origin: str | None) -> None:
    """Admit a WebSocket connection's ``Origin`` header under the app's
    ``allowed_origins`` (``*`` admits any, also none; a pattern, the origins of its
    scheme, host and port: :func:`broadcaster.origins.origin_allowed`).

    Raises:
        ProtocolError: ``UNAUTHORIZED`` (closes), naming the origin and what is allowed.
    """
    if origin_allowed(origin, app.allowed_origins):
        return
    raise ProtocolError(
        ErrorCode.UNAUTHORIZED,
        f"origin {None if origin is None else excerpt(origin, 100)} is not allowed for "
        f"app {app.id!r}; allowed: " + ", ".join(app.allowed_origins),
    )


def check_protocol_version(version: str | None) -> None:
    """Admit the ``protocol`` query parameter of ``/app/{key}``: :data:`PROTOCOL_VERSION`.

    Raises:
        ProtocolError: ``NO_PROTOCOL_VERSION``, ``INVALID_VERSION`` (not a number) or
            ``UNSUPPORTED_PROTOCOL`` (another number); each closes the connection.
    """
    if version is None:
        raise ProtocolError(
            ErrorCode.NO_PROTOCOL_VERSION,
            f"no protocol version: connect to /app/<key>?protocol={PROTOCOL_VERSION}",
        )
    if not (version.isascii() and version.isdigit()):
        raise ProtocolError(
            ErrorCode.INVALID_VERSION,
            f"protocol version {excerpt(version)} is not a number; use protocol={PROTOCOL_VERSION}",
        )
    # Compared as text: int() of thousands of digits raises (and costs time).
    if version.lstrip("0") != str(PROTOCOL_VERSION):
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_PROTOCOL,
            f"protocol version {excerpt(version)} is not supported; "
            f"use protocol={PROTOCOL_VERSION}",
        )


def check_channel_limit(app: AppRules, subscribed: int, channel: str) -> None:
    """Admit one more subscription on a connection that has ``subscribed`` channels.

    Raises:
        ProtocolError: ``TOO_MANY_CHANNELS`` (the connection stays open) at the app's
            ``max_channels_per_connection``.
    """
    limit = app.max_channels_per_connection
    if subscribed >= limit:
        raise ProtocolError(
            ErrorCode.TOO_MANY_CHANNELS,
            f"this connection already has {limit} subscriptions (the app's "
            "max_channels_per_connection); unsubscribe from one first",
            channel=channel,
            close=False,
        )


# -- server frames ----------------------------------------------------------------------


def exact(data: bytes) -> bytes:
    """``data`` in an allocation of its own size.

    orjson returns its output in a buffer it does not shrink (about 4 KB for a
    300-byte frame, 64 KB for an 8 KB one, with orjson 3.13), so a frame waiting in a
    connection's queue, a resume's held list or the transport would weigh many times
    the bytes that ``max_buffer_bytes`` counts. Every server frame goes through this:
    one copy, about 40 ns for a small frame."""
    return b"".join((data, b""))  # two parts: always a new, exact bytes object


def _frame(event: str, data: object, channel: str | None = None) -> bytes:
    # pusher:* and pusher_internal:* events carry data as a JSON-encoded string.
    frame: dict[str, object] = {"event": event, "data": orjson.dumps(data).decode()}
    if channel is not None:
        frame["channel"] = channel
    return exact(orjson.dumps(frame))


def connection_established(socket_id: str, activity_timeout: int) -> bytes:
    """``pusher:connection_established``: the first message of every connection.

    ``activity_timeout`` (seconds) is how long a client may stay silent before it pings.
    """
    data = {"socket_id": socket_id, "activity_timeout": activity_timeout}
    return _frame("pusher:connection_established", data)


def ping() -> bytes:
    """``pusher:ping``: the server checks that a silent client is still there."""
    return _frame("pusher:ping", {})


def pong() -> bytes:
    """``pusher:pong``: the answer to a client's ``pusher:ping``."""
    return _frame("pusher:pong", {})


def error(code: ErrorCode | int | None, message: str) -> bytes:
    """``pusher:error`` with ``{"code", "message"}`` (``code`` may be null)."""
    return _frame("pusher:error", {"code": None if code is None else int(code), "message": message})


def subscription_succeeded(channel: str, presence: Mapping[str, Any] | None = None) -> bytes:
    """``pusher_internal:subscription_succeeded``.

    Args:
        channel: the channel joined.
        presence: for a presence channel, the members: user id -> user info. The data is
            then ``{"presence": {"ids": [...], "hash": {...}, "count": n}}``, which
            pusher-js turns into ``channel.members``.
    """
    if presence is None:
        return _frame("pusher_internal:subscription_succeeded", {}, channel)
    members = dict(presence)
    data = {"presence": {"ids": list(members), "hash": members, "count": len(members)}}
    return _frame("pusher_internal:subscription_succeeded", data, channel)


def subscription_error(
    channel: str,
    message: str,
    *,
    status: int = 401,
    error_type: str = "AuthError",
    code: ErrorCode | None = None,
) -> bytes:
    """``pusher:subscription_error`` on ``channel``: pusher-js emits it to
    ``channel.bind("pusher:subscription_error", ...)`` (Laravel Echo: ``.error()``).

    The data is ``{"type", "error", "status"}`` as soketi sends it, plus ``"code"`` when
    given.
    """
    data: dict[str, object] = {"type": error_type, "error": message, "status": status}
    if code is not None:
        data["code"] = int(code)
    return _frame("pusher:subscription_error", data, channel)


def subscription_count(channel: str, count: int) -> bytes:
    """``pusher_internal:subscription_count``: how many connections are subscribed."""
    return _frame("pusher_internal:subscription_count", {"subscription_count": count}, channel)


@dataclass(frozen=True, slots=True)
class Notice:
    """A server event published through the backend like any publication (so that every
    node's subscribers get it): its ``event`` name and its ``data`` as JSON text."""

    event: str
    data: str


def member_added_notice(member: PresenceMember) -> Notice:
    """The ``pusher_internal:member_added`` publication for ``member``."""
    data = {"user_id": member.user_id, "user_info": member.user_info}
    return Notice(MEMBER_ADDED, orjson.dumps(data).decode())


def member_removed_notice(user_id: str) -> Notice:
    """The ``pusher_internal:member_removed`` publication for ``user_id``."""
    return Notice(MEMBER_REMOVED, orjson.dumps({"user_id": user_id}).decode())


def member_added(channel: str, user_id: str, user_info: Any = None) -> bytes:
    """``pusher_internal:member_added``: a user joined the presence channel.

    ``user_info`` is a JSON value as :func:`parse_presence_member` returns it.
    """
    data = {"user_id": user_id, "user_info": user_info}
    return _frame(MEMBER_ADDED, data, channel)


def member_removed(channel: str, user_id: str) -> bytes:
    """``pusher_internal:member_removed``: a user's last connection left the channel."""
    return _frame(MEMBER_REMOVED, {"user_id": user_id}, channel)


def signin_success(user_data: str) -> bytes:
    """``pusher:signin_success`` echoing the signed ``user_data`` text."""
    return _frame("pusher:signin_success", {"user_data": user_data})


channel_event = channel_event_frame
"""A channel event, encoded once for every subscriber: the frame has one home,
:func:`broadcaster.publication.channel_event_frame` (here under the name the rest of
the protocol uses)."""


def channel_event_publication(
    app_id: str, position: Position | None, exclude_socket_id: str | None, frame: bytes
) -> Publication:
    """The publication that :func:`channel_event` encoded as ``frame``.

    Raises:
        ValueError: ``frame`` is not a channel event.
    """
    event, channel, data, user_id = parse_channel_event(frame)
    return Publication(app_id, channel, event, data, exclude_socket_id, user_id, position)


def resume_result(
    channel: str,
    recovered: bool,
    position: Position | str | None,
    reason: str | None = None,
) -> bytes:
    """``broadcaster:resume`` (our extension): the answer to a subscription with
    ``position``.

    Args:
        channel: the channel.
        recovered: whether every missed publication was sent before this message.
        position: the channel's current position, to resume from next time (None if the
            channel has no history yet).
        reason: why not recovered (history expired, epoch changed), for the client's log.
    """
    data: dict[str, object] = {
        "recovered": recovered,
        "position": None if position is None else str(position),
    }
    if reason is not None:
        data["reason"] = reason
    return _frame(RESUME_EVENT, data, channel)
