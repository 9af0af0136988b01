"""The publication payload: what goes through Redis pub/sub and into a history.

A payload is a one-line header and the channel event exactly as clients receive it
(:func:`broadcaster.publication.channel_event_frame`), so a node routes and orders it
from the header and sends the frame without decoding or encoding JSON::

    2 <app_id> <channel> <offset> <epoch> <exclude_socket_id>\\n{"event": …, "position": "…"}

(``-`` for a missing offset, epoch or socket id). The publish script
(:data:`broadcaster.backends.redis.scripts.PUBLISH`) writes the position into both the
header and the frame from the parts :func:`script_payload` gives it. Payloads of
format 1 (a JSON array) written by earlier versions stay readable in histories.
"""

from __future__ import annotations

from typing import Any

import orjson

from broadcaster.publication import (
    FRAME_POSITION,
    Position,
    Publication,
    frame_head,
    make_position,
    parse_channel_event,
)

__all__ = [
    "FORMAT_VERSION",
    "decode_publication",
    "encode_publication",
    "ms",
    "position_of",
    "publish_result",
    "route_head",
    "script_payload",
    "split_payload",
    "text",
]

FORMAT_VERSION = 2
"""The payload format written (the header's first field)."""


def encode_publication(publication: Publication) -> bytes:
    """The publication as published to Redis without a position (see the module doc):
    ``2 <app_id> <channel> - - <exclude_socket_id or ->`` and a newline, then the channel
    event exactly as clients receive it.

    Raises:
        ValueError: the app id, channel or socket id is empty or holds a space or a
            line break (a node could not route such a publication).
    """
    route, exclude = _routing(publication)
    return route + b" - - " + exclude + b"\n" + _head(publication) + b"}"


def script_payload(publication: Publication) -> tuple[bytes, bytes]:
    """The publish script's two payload parts: it publishes ``before .. offset .. ' '
    .. epoch .. after .. epoch .. ':' .. offset .. FRAME_END``, the position in both
    the header and the frame.

    Raises:
        ValueError: as :func:`encode_publication`.
    """
    route, exclude = _routing(publication)
    return route + b" ", b" " + exclude + b"\n" + _head(publication) + FRAME_POSITION


def _routing(p: Publication) -> tuple[bytes, bytes]:
    """``2 <app_id> <channel>`` and the excluded socket id (``-`` for none)."""
    exclude = p.exclude_socket_id
    for name, value in (("app id", p.app_id), ("channel", p.channel), ("socket id", exclude)):
        if value is not None and (not value or " " in value or "\n" in value):
            raise ValueError(f"cannot publish with the {name} {value!r}: empty or with a space")
    route = b"%d %b %b" % (FORMAT_VERSION, p.app_id.encode(), p.channel.encode())
    return route, b"-" if exclude is None else exclude.encode()


def _head(p: Publication) -> bytes:
    return frame_head(p.event, p.channel, p.data, p.user_id)


def route_head(app_id: str, channel: str) -> bytes:
    """What every payload of ``app_id``'s ``channel`` starts with (``2 <app_id>
    <channel> ``): a direct route (:mod:`broadcaster._routes`) checks it."""
    return b"%d %b %b " % (FORMAT_VERSION, app_id.encode(), channel.encode())


def split_payload(payload: bytes) -> tuple[str, str, Position | None, str | None, bytes]:
    """``(app_id, channel, position, exclude_socket_id, frame)`` of a payload made by
    :func:`encode_publication` or the publish script, without decoding the frame.

    Raises:
        ValueError: if ``payload`` is not such a payload.
    """
    head, _, frame = payload.partition(b"\n")
    try:
        version, app_id, channel, offset, epoch, exclude = head.split(b" ")
        if version != b"2" or not frame:
            raise ValueError
        position = None if offset == b"-" else make_position(int(offset), epoch.decode())
        return (
            app_id.decode(),
            channel.decode(),
            position,
            None if exclude == b"-" else exclude.decode(),
            frame,
        )
    except ValueError:
        raise ValueError(f"not a publication payload: {payload[:80]!r}") from None


def decode_publication(payload: bytes | str) -> Publication:
    """Decode a payload made by :func:`encode_publication` (and the publish script), or
    by a version before 2 (``[1, app_id, channel, event, data, exclude, user_id]`` and
    ``offset, epoch`` when kept in history), which stays readable in histories.

    Raises:
        ValueError: if ``payload`` is not such a payload.
    """
    raw = payload.encode() if isinstance(payload, str) else payload
    if raw[:1] != b"[":
        app_id, channel, position, exclude, frame = split_payload(raw)
        event, in_frame, data, user_id = parse_channel_event(frame)
        if in_frame != channel:
            raise ValueError(f"not a publication payload: {raw[:80]!r}")
        return Publication(app_id, channel, event, data, exclude, user_id, position)
    try:
        v = orjson.loads(raw)
        if v[0] != 1:
            raise ValueError(f"unknown payload format version {v[0]!r}")
        if len(v) == 9:
            return Publication(v[1], v[2], v[3], v[4], v[5], v[6], Position(v[7], v[8]))
        return Publication(v[1], v[2], v[3], v[4], v[5], v[6])
    except (orjson.JSONDecodeError, IndexError, KeyError, TypeError) as exc:
        raise ValueError(f"not a publication payload: {raw[:80]!r}") from exc


def position_of(reply: Any) -> Position:
    """The position a publish script returned (``{offset, epoch}``)."""
    offset, epoch = reply
    return make_position(int(offset), epoch.decode() if type(epoch) is bytes else epoch)


def publish_result(reply: Any, scripted: bool) -> Position | BaseException | None:
    """What a publication's reply in a batch means: its error, its position (the publish
    script's reply), or None (a plain ``PUBLISH``, kept in no history)."""
    if isinstance(reply, BaseException):
        return reply
    return position_of(reply) if scripted else None


def ms(seconds: float) -> int:
    """``seconds`` as Redis milliseconds (at least 1)."""
    return max(1, int(seconds * 1000))


def text(value: bytes | str) -> str:
    """A reply as text."""
    return value.decode() if isinstance(value, bytes) else value
