"""A publication: one event on one channel of one app, as it moves between nodes.

Backends move publications; the hub turns each into a WebSocket frame exactly once and
writes the same bytes to every local subscriber.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Position", "Publication"]


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
            ValueError: if ``text`` is not in that form.
        """
        epoch, sep, offset = text.rpartition(":")
        if not sep or not epoch or not offset.isdigit():
            shown = repr(text) if len(text) <= 100 else f"{text[:100]!r}..."
            raise ValueError(f"invalid position {shown}: expected '<epoch>:<offset>'")
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
