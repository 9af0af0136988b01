"""A publication: one event on one channel of one app, as it moves between nodes.

Backends move publications; the hub turns each into a WebSocket frame exactly once and
writes the same bytes to every local subscriber. The layout of that frame, the channel
event, has its one home here (:func:`channel_event_frame`): the protocol module sends
it, and the Redis backend's publish script completes it from the pieces given here
(:func:`frame_head`, :data:`FRAME_POSITION`, :data:`FRAME_END`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from broadcaster._text import excerpt

__all__ = [
    "FRAME_END",
    "FRAME_POSITION",
    "MAX_EPOCH_LENGTH",
    "MAX_OFFSET_DIGITS",
    "Position",
    "PresenceMember",
    "Publication",
    "channel_event_frame",
    "frame_head",
    "make_position",
    "make_publication",
    "parse_channel_event",
]

MAX_OFFSET_DIGITS = 18
"""Longest offset a client may send (below 2**63, what Redis counts to)."""
MAX_EPOCH_LENGTH = 64
"""Longest epoch a client may send (the backends make 8-character ones)."""


@dataclass(frozen=True, slots=True)
class Position:
    """Where a publication sits in its channel's history.

    ``offset`` grows by one per publication on the channel; ``epoch`` changes whenever
    the history is lost (a restarted memory node, a flushed Redis), so a client holding
    an offset from another epoch knows that it cannot be resumed.
    """

    offset: int
    epoch: str

    def __str__(self) -> str:
        return f"{self.epoch}:{self.offset}"

    @classmethod
    def parse(cls, text: str) -> Position:
        """Parse ``"<epoch>:<offset>"``.

        Raises:
            ValueError: if ``text`` is not in that form: an epoch of 1 to 64 characters,
                ``:`` and an offset of 1 to 18 ASCII digits.
        """
        epoch, sep, offset = text.rpartition(":")
        if (
            not sep
            or not 0 < len(epoch) <= MAX_EPOCH_LENGTH
            or not (offset.isascii() and offset.isdigit())
            or len(offset) > MAX_OFFSET_DIGITS
        ):
            raise ValueError(
                f"invalid position {excerpt(text)}: expected '<epoch>:<offset>' (an epoch of "
                f"at most {MAX_EPOCH_LENGTH} characters, an offset of at most "
                f"{MAX_OFFSET_DIGITS} digits)"
            )
        return cls(offset=int(offset), epoch=epoch)


_new = object.__new__
_set_offset = Position.__dict__["offset"].__set__
_set_epoch = Position.__dict__["epoch"].__set__


def make_position(offset: int, epoch: str) -> Position:
    """``Position(offset, epoch)``, made about twice as fast (for the backends, which
    make one per publication received): the frozen dataclass's ``__init__`` sets each
    field through ``object.__setattr__``; this sets the slots directly."""
    position: Position = _new(Position)
    _set_offset(position, offset)
    _set_epoch(position, epoch)
    return position


@dataclass(frozen=True, slots=True)
class Publication:
    """An event published on ``channel`` of app ``app_id``.

    ``data`` is the Pusher event data, already a string (JSON text for agent envelopes).
    ``exclude_socket_id`` is the publisher's own connection (Pusher's ``socket_id``
    parameter), which must not receive it on any node. ``user_id`` is set for client
    events on presence channels. ``position`` is assigned by the backend on publish.
    """

    app_id: str
    channel: str
    event: str
    data: str
    exclude_socket_id: str | None = None
    user_id: str | None = None
    position: Position | None = None


_set_publication = tuple(
    Publication.__dict__[name].__set__
    for name in ("app_id", "channel", "event", "data", "exclude_socket_id")
)
_set_user_id = Publication.__dict__["user_id"].__set__
_set_position = Publication.__dict__["position"].__set__


def make_publication(
    app_id: str, channel: str, event: str, data: str, exclude_socket_id: str | None = None
) -> Publication:
    """``Publication(app_id, channel, event, data, exclude_socket_id)`` (no user, no
    position yet), made faster, as :func:`make_position` (for the HTTP API, which makes
    one per published channel)."""
    set_app_id, set_channel, set_event, set_data, set_exclude = _set_publication
    publication: Publication = _new(Publication)
    set_app_id(publication, app_id)
    set_channel(publication, channel)
    set_event(publication, event)
    set_data(publication, data)
    set_exclude(publication, exclude_socket_id)
    _set_user_id(publication, None)
    _set_position(publication, None)
    return publication


@dataclass(frozen=True, slots=True)
class PresenceMember:
    """A presence channel member, from the subscription's ``channel_data`` (parsed by
    :func:`broadcaster.protocol.parse_presence_member`), as the backends keep it.

    ``user_id`` is always a string (numbers are converted, as presence hashes key by
    string); ``user_info`` is any JSON value, ``None`` when not given.
    """

    user_id: str
    user_info: Any = None


# -- the channel event: the frame of a publication ---------------------------------------

FRAME_POSITION = b',"position":"'
"""What follows :func:`frame_head` when the event has a position; the position
(``<epoch>:<offset>``) and :data:`FRAME_END` follow it."""
FRAME_END = b'"}'
"""What ends a channel event after its position."""


def frame_head(event: str, channel: str, data: str, user_id: str | None = None) -> bytes:
    """The channel event ``{"event", "channel", "data"[, "user_id"]`` without its
    closing brace: ``}`` ends an event without a position, :data:`FRAME_POSITION`,
    the position and :data:`FRAME_END` one with."""
    frame: dict[str, str] = {"event": event, "channel": channel, "data": data}
    if user_id is not None:
        frame["user_id"] = user_id
    return orjson.dumps(frame)[:-1]


def channel_event_frame(
    event: str,
    channel: str,
    data: str,
    user_id: str | None = None,
    position: Position | str | None = None,
) -> bytes:
    """A channel event ``{"event", "channel", "data"[, "user_id"][, "position"]}``.

    Args:
        event: the event name.
        channel: the channel.
        data: the event data, already text (sent as is, as Pusher does).
        user_id: the sender of a client event on a presence channel.
        position: our extension: where the event sits in the channel's history.
    """
    head = frame_head(event, channel, data, user_id)
    if position is None:
        return head + b"}"
    text = orjson.dumps(str(position))[1:-1]  # a position needs no escaping; a str might
    return b"".join((head, FRAME_POSITION, text, FRAME_END))


def parse_channel_event(frame: bytes) -> tuple[str, str, str, str | None]:
    """``(event, channel, data, user_id)`` of a channel event.

    Raises:
        ValueError: ``frame`` is not a channel event.
    """
    try:
        v = orjson.loads(frame)
        event, channel, data, user_id = v["event"], v["channel"], v["data"], v.get("user_id")
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise ValueError(f"not a channel event: {frame[:80]!r}") from None
    if not all(isinstance(x, str) for x in (event, channel, data)) or not isinstance(
        user_id, str | None
    ):
        raise ValueError(f"not a channel event: {frame[:80]!r}")
    return event, channel, data, user_id
