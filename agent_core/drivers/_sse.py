"""A sans-I/O server-sent events decoder: bytes in, lines out (:class:`LineDecoder`),
lines in, events out (:class:`SSEDecoder`).

It follows the WHATWG ``text/event-stream`` rules that matter to model APIs: ``data:``
lines of one event are joined with ``\\n``, a blank line dispatches the event, lines
starting with ``:`` are comments (keep-alives), a single space after the colon is
dropped, and unknown fields are ignored. :class:`LineDecoder` splits the body on
``\\n``, ``\\r\\n`` and ``\\r``.

Both decoders can bound what they hold, so that a peer that never ends a line or an
event cannot grow memory: over the limit they raise :class:`SSELimitError`.

One deliberate leniency: :meth:`SSEDecoder.flush` dispatches an event still pending at
the end of the stream, where the standard would drop it, so that a server that omits
the final blank line does not lose its last chunk.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["LineDecoder", "SSEDecoder", "SSELimitError", "ServerSentEvent"]


class SSELimitError(ValueError):
    """A line, or the data of one event, is longer than the decoder's limit."""

    def __init__(self, what: str, limit: int) -> None:
        super().__init__(f"{what} is longer than {limit}")
        self.what = what
        self.limit = limit


class LineDecoder:
    """Splits a byte stream into text lines (UTF-8, bad bytes replaced).

    Args:
        max_line_bytes: the longest line accepted, in bytes without its line ending.
    """

    def __init__(self, max_line_bytes: int) -> None:
        self.max_line_bytes = max_line_bytes
        self._buffer = bytearray()
        self._cr = False  # the last chunk ended with \r: maybe half of a \r\n

    def feed(self, data: bytes) -> list[str]:
        """The lines that ``data`` completes, without their line endings.

        Raises:
            SSELimitError: a line, complete or not, is longer than ``max_line_bytes``.
        """
        if self._cr:
            data = b"\r" + data
        self._cr = data.endswith(b"\r")
        if self._cr:
            data = data[:-1]
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        end = data.rfind(b"\n")
        if end < 0:
            self._buffer += data
            self._check(len(self._buffer))
            return []
        complete = self._buffer + data[:end] if self._buffer else data[:end]
        lines = complete.split(b"\n")
        self._buffer = bytearray(data[end + 1 :])
        self._check(max(map(len, lines)))
        self._check(len(self._buffer))
        return [line.decode("utf-8", "replace") for line in lines]

    def flush(self) -> list[str]:
        """The unterminated last line, if any (at the end of the stream)."""
        lines = [self._buffer.decode("utf-8", "replace")] if self._buffer or self._cr else []
        self._buffer.clear()
        self._cr = False
        return lines

    def _check(self, length: int) -> None:
        if length > self.max_line_bytes:
            raise SSELimitError("a line", self.max_line_bytes)


@dataclass(frozen=True)
class ServerSentEvent:
    """One dispatched event; ``event`` is ``"message"`` unless the server named it."""

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


@dataclass
class SSEDecoder:
    """Collects the fields of one event across lines and dispatches it on a blank line.

    ``max_data_length`` bounds the data of one event (its ``data:`` lines joined), in
    characters; ``None`` means no limit.
    """

    max_data_length: int | None = None
    _data: list[str] = field(default_factory=list)
    _data_length: int = 0
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
        self._data_length = 0
        self._event = ""
        return event

    def _set_field(self, name: str, value: str) -> None:
        if name == "data":
            self._add_data(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isdigit():
            self._retry = int(value)

    def _add_data(self, value: str) -> None:
        self._data_length += len(value) + 1
        if self.max_data_length is not None and self._data_length > self.max_data_length + 1:
            raise SSELimitError("an event's data", self.max_data_length)
        self._data.append(value)
