"""Request bodies of the Pusher HTTP API, validated without I/O.

``POST /apps/{app_id}/events`` takes one event::

    {"name": "agent.step", "data": "<text>", "channel": "agent.1" | "channels": [...],
     "socket_id": "123.456"?, "info": "user_count,subscription_count"?}

``POST /apps/{app_id}/batch_events`` takes ``{"batch": [event, ...]}`` where each event
names one ``channel``. :func:`parse_trigger` and :func:`parse_batch` return normalized
:class:`TriggerRequest` objects or raise :class:`~broadcaster.exceptions.ApiError` (400
with what is wrong, 413 when ``data`` is over the app's limit).

``PUT /apps/{app_id}/channels/{channel}/state`` takes a session's final slim snapshot
(:func:`parse_state`: 422 when it is not one, or has no ``execution.updated_at``: its
version, :func:`state_version`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from broadcaster._text import excerpt
from broadcaster.channels import validate_channel_name
from broadcaster.envelope import MAX_WIRE_INT
from broadcaster.exceptions import ApiError, ProtocolError
from broadcaster.http_input import validation_details
from broadcaster.protocol import is_valid_socket_id
from broadcaster.settings import AppConfig

__all__ = [
    "INFO_ATTRIBUTES",
    "RESERVED_EVENT_PREFIXES",
    "TriggerRequest",
    "parse_batch",
    "parse_info",
    "parse_state",
    "parse_trigger",
    "state_version",
]

RESERVED_EVENT_PREFIXES = ("pusher:", "pusher_internal:", "broadcaster:")
"""Event names the server sends itself; the HTTP API refuses them."""

INFO_ATTRIBUTES = frozenset({"user_count", "subscription_count"})
"""The channel attributes a request may ask for in ``info``."""


@dataclass(frozen=True, slots=True)
class TriggerRequest:
    """One event to publish, normalized: always a tuple of distinct ``channels``.

    ``socket_id`` is the publisher's connection, excluded from delivery; ``info`` is the
    set of channel attributes to return in the response. (Built from validated fields
    only: a plain dataclass, not validated again.)
    """

    name: str
    data: str
    channels: tuple[str, ...]
    socket_id: str | None = None
    info: frozenset[str] = frozenset()


class _EventBody(BaseModel):
    # Unknown fields are ignored: SDKs may send fields of newer API versions.
    model_config = ConfigDict(extra="ignore")

    name: StrictStr
    data: StrictStr
    channel: StrictStr | None = None
    channels: list[StrictStr] | None = None
    socket_id: StrictStr | None = None
    info: StrictStr | None = None


class _BatchBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    batch: list[Any]


def parse_trigger(body: bytes, app: AppConfig) -> TriggerRequest:
    """Validate the body of ``POST /apps/{app_id}/events``.

    Raises:
        ApiError: 400 saying which field is wrong; 413 if ``data`` is larger than
            ``app.max_event_data_size``.
    """
    return _event(_json_object(body), app, where="")


def parse_batch(body: bytes, app: AppConfig) -> list[TriggerRequest]:
    """Validate the body of ``POST /apps/{app_id}/batch_events``.

    Raises:
        ApiError: 400 saying which event and field is wrong (``batch[2]: name is required``) or
            that the batch is empty or over ``app.max_batch_size``; 413 if an event's
            ``data`` is over the limit.
    """
    value = _json_object(body)
    events = value.get("batch")
    if type(events) is not list:  # exactly a JSON array; else pydantic says what is wrong
        try:
            events = _BatchBody.model_validate(value).batch
        except ValidationError as exc:
            raise ApiError(400, _describe(exc, "")) from None
    if not events:
        raise ApiError(400, f"batch is empty: send 1 to {app.max_batch_size} events")
    if len(events) > app.max_batch_size:
        raise ApiError(400, f"batch has {len(events)} events; the limit is {app.max_batch_size}")
    return [_event(event, app, where=f"batch[{i}]: ") for i, event in enumerate(events)]


def parse_info(text: str | None) -> frozenset[str]:
    """Parse an ``info`` parameter: comma-separated attributes.

    Raises:
        ApiError: 400 naming an unknown attribute.
    """
    if not text:
        return frozenset()
    attributes = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(attributes - INFO_ATTRIBUTES)
    if unknown:
        allowed = ", ".join(sorted(INFO_ATTRIBUTES))
        named = excerpt(", ".join(unknown))
        raise ApiError(400, f"unknown info attribute(s) {named}: use {allowed}")
    return attributes


_Count = Annotated[StrictInt, Field(ge=0, le=MAX_WIRE_INT)]


class _Usage(BaseModel):
    prompt: _Count
    completion: _Count
    total: _Count


def state_version(updated_at: object) -> datetime | None:
    """The version of a stored state: its ``execution.updated_at`` as an aware moment,
    or None when it has none that reads as one (ISO 8601 with a zone)."""
    if not isinstance(updated_at, str) or len(updated_at) > 64:
        return None
    try:
        moment = datetime.fromisoformat(updated_at)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


class _Execution(BaseModel):
    model_config = ConfigDict(extra="allow")

    updated_at: StrictStr

    @field_validator("updated_at")
    @classmethod
    def _a_moment(cls, value: str) -> str:
        if state_version(value) is None:
            raise ValueError(
                "must be when the state was stored, ISO 8601 with a zone "
                "(2026-01-16T10:05:00.123Z): a stored state is replaced only by a newer one"
            )
        return value


class _Message(BaseModel):
    role: Literal["system", "user", "assistant", "tool"]
    content: StrictStr
    metadata: dict[str, Any]


class SessionState(BaseModel):
    """What a stored session state must be: a slim snapshot (docs/agent_core.md).

    Its other fields (``steps``, ``last_continuation``, ...) are kept as sent.
    """

    model_config = ConfigDict(extra="allow")

    agent_id: StrictStr = Field(min_length=1)
    status: Literal["completed", "failed"]
    step_count: _Count
    usage: _Usage
    execution: _Execution
    messages: list[_Message]
    steps: list[dict[str, Any]]
    metadata: dict[str, Any]

    @property
    def version(self) -> datetime:
        """``execution.updated_at``: what must grow from one stored state to the next."""
        moment = state_version(self.execution.updated_at)
        assert moment is not None, "validated"
        return moment


def parse_state(body: bytes) -> SessionState:
    """The session state in ``body``.

    Raises:
        ApiError: 422 with what is wrong (not JSON, not an object, not a final slim
            snapshot).
    """
    try:
        value = _json_object(body)
        return SessionState.model_validate(value)
    except ApiError as exc:
        raise ApiError(422, exc.message) from None
    except ValidationError as exc:
        raise ApiError(422, f"not a final slim snapshot: {_describe(exc, '')}") from None


def _json_object(body: bytes) -> dict[str, Any]:
    if not body:
        raise ApiError(400, "request body is empty: send a JSON object")
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ApiError(400, "request body must be a JSON object")
    return value


def _event(value: object, app: AppConfig, where: str) -> TriggerRequest:
    if not isinstance(value, dict):
        raise ApiError(400, f"{where}event must be a JSON object")
    if len(value) == 3:  # the usual event: its name, data and one channel
        name = value.get("name")
        data = value.get("data")
        channel = value.get("channel")
        if type(name) is str and type(data) is str and type(channel) is str:
            _check_name(name, app, where)
            _check_data(data, app, where)
            return TriggerRequest(name=name, data=data, channels=(_channel(channel, where),))
    body = _plain_event(value)
    if body is None:
        try:
            valid = _EventBody.model_validate(value)
        except ValidationError as exc:
            raise ApiError(400, _describe(exc, where)) from None
        body = _Fields(
            valid.name, valid.data, valid.channel, valid.channels, valid.socket_id, valid.info
        )
    _check_name(body.name, app, where)
    _check_data(body.data, app, where)
    _check_socket_id(body.socket_id, where)
    return TriggerRequest(
        name=body.name,
        data=body.data,
        channels=_channels(body, app, where),
        socket_id=body.socket_id,
        info=_info(body.info, where),
    )


@dataclass(slots=True)
class _Fields:
    """An event's fields, of the types :class:`_EventBody` validates."""

    name: str
    data: str
    channel: str | None
    channels: list[str] | None
    socket_id: str | None
    info: str | None


def _plain_event(value: dict[str, Any]) -> _Fields | None:
    """The fields of an event whose types are plainly right (as JSON gives them: exact
    ``str``, ``list`` of ``str``, or null), without pydantic; None for anything else,
    which :class:`_EventBody` then validates (and says what is wrong)."""
    name = value.get("name")
    data = value.get("data")
    channel = value.get("channel")
    channels = value.get("channels")
    socket_id = value.get("socket_id")
    info = value.get("info")
    if (
        type(name) is str
        and type(data) is str
        and (channel is None or type(channel) is str)
        and (channels is None or (type(channels) is list and all(type(c) is str for c in channels)))
        and (socket_id is None or type(socket_id) is str)
        and (info is None or type(info) is str)
    ):
        return _Fields(name, data, channel, channels, socket_id, info)
    return None


def _check_name(name: str, app: AppConfig, where: str) -> None:
    if not name:
        raise ApiError(400, f"{where}name is empty")
    if len(name) > app.max_event_name_length:
        raise ApiError(
            400,
            f"{where}name is {len(name)} characters long; the limit is {app.max_event_name_length}",
        )
    if name.startswith(RESERVED_EVENT_PREFIXES):
        raise ApiError(
            400,
            f"{where}name {name!r} is reserved: event names may not start with "
            + ", ".join(RESERVED_EVENT_PREFIXES),
        )


def _check_data(data: str, app: AppConfig, where: str) -> None:
    if len(data) * 4 <= app.max_event_data_size:
        return  # at most 4 bytes per character in UTF-8
    size = len(data.encode("utf-8", "surrogatepass"))
    if size > app.max_event_data_size:
        raise ApiError(
            413,
            f"{where}data is {size} bytes; the limit is {app.max_event_data_size} bytes",
        )


def _check_socket_id(socket_id: str | None, where: str) -> None:
    if socket_id is not None and not is_valid_socket_id(socket_id):
        raise ApiError(
            400, f"{where}socket_id {excerpt(socket_id)} is not a socket id like '123.456'"
        )


def _channels(body: _Fields, app: AppConfig, where: str) -> tuple[str, ...]:
    if (body.channel is None) == (body.channels is None):
        raise ApiError(400, f"{where}give exactly one of 'channel' or 'channels'")
    names = [body.channel] if body.channel is not None else body.channels or []
    if not names:
        raise ApiError(400, f"{where}channels is empty: name 1 to {app.max_event_channels}")
    if len(names) > app.max_event_channels:
        raise ApiError(
            400,
            f"{where}channels has {len(names)} channels; the limit is {app.max_event_channels}",
        )
    for name in names:
        _channel(name, where)
    return tuple(dict.fromkeys(names))


def _channel(name: str, where: str) -> str:
    try:
        return validate_channel_name(name)
    except ProtocolError as exc:
        raise ApiError(400, f"{where}{exc.message}") from None


def _info(text: str | None, where: str) -> frozenset[str]:
    try:
        return parse_info(text)
    except ApiError as exc:
        raise ApiError(exc.status, f"{where}info: {exc.message}") from None


def _describe(exc: ValidationError, where: str) -> str:
    # Few and cut: unknown fields are named by the client, as many as its body holds.
    details = validation_details(exc, most=3)
    return "; ".join(_describe_one(err, where) for err in details)


def _describe_one(err: Any, where: str) -> str:
    field = ".".join(str(part) for part in err["loc"])
    if err["type"] == "more_errors":
        return f"and {err['msg']} errors"
    if err["type"] == "missing":
        return f"{where}{field} is required"
    if field == "data" and err["type"] == "string_type":
        return f"{where}data must be a string: encode objects as JSON text first"
    return f"{where}{field}: {err['msg']}"
