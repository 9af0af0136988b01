"""A publication: one event on one channel of one app, as it moves between nodes.

Backends move publications; the hub turns each into a WebSocket frame exactly once and
writes the same bytes to every local subscriber.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from broadcaster._text import excerpt

__all__ = ["MAX_EPOCH_LENGTH", "MAX_OFFSET_DIGITS", "Position", "PresenceMember", "Publication"]

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


@dataclass(frozen=True, slots=True)
class PresenceMember:
    """A presence channel member, from the subscription's ``channel_data`` (parsed by
    :func:`broadcaster.protocol.parse_presence_member`), as the backends keep it.

    ``user_id`` is always a string (numbers are converted, as presence hashes key by
    string); ``user_info`` is any JSON value, ``None`` when not given.
    """

    user_id: str
    user_info: Any = None
