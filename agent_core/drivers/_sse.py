"""A sans-I/O server-sent events decoder: text lines in, events out.

It follows the WHATWG ``text/event-stream`` rules that matter to model APIs: ``data:``
lines of one event are joined with ``\\n``, a blank line dispatches the event, lines
starting with ``:`` are comments (keep-alives), a single space after the colon is
dropped, and unknown fields are ignored. Line splitting (``\\n``, ``\\r\\n``, ``\\r``) is
the caller's job (``httpx.Response.aiter_lines`` does it).

One deliberate leniency: :meth:`SSEDecoder.flush` dispatches an event still pending at
the end of the stream, where the standard would drop it, so that a server that omits
the final blank line does not lose its last chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SSEDecoder", "ServerSentEvent"]


@dataclass(frozen=True)
class ServerSentEvent:
    """One dispatched event; ``event`` is ``"message"`` unless the server named it."""

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


@dataclass
class SSEDecoder:
    """Collects the fields of one event across lines and dispatches it on a blank line."""

    _data: list[str] = field(default_factory=list)
    _event: str = ""
    _id: str | None = None
    _retry: int | None = None

    def feed_line(self, line: str) -> ServerSentEvent | None:
        """Take one line (without its line ending).

        Returns:
            The completed event when ``line`` is blank and an event is pending, else
            ``None``.
        """
        if not line:
            return self.flush()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        self._set_field(name, value.removeprefix(" "))
        return None

    def flush(self) -> ServerSentEvent | None:
        """Dispatch the pending event, if any, and start a new one."""
        if not self._data:
            self._event = ""
            return None
        event = ServerSentEvent(
            data="\n".join(self._data),
            event=self._event or "message",
            id=self._id,
            retry=self._retry,
        )
        self._data.clear()
        self._event = ""
        return event

    def _set_field(self, name: str, value: str) -> None:
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isdigit():
            self._retry = int(value)
