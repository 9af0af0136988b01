"""Server-to-client WebSocket frames, built once and shared by every subscriber.

A server frame is never masked and the server never compresses, so a text frame is just
a two-to-ten byte header (FIN + opcode text, payload length) followed by the payload.
"""

from __future__ import annotations

import struct

__all__ = ["MAX_CLOSE_REASON_BYTES", "PreparedMessage", "close_reason", "text_frame"]

MAX_CLOSE_REASON_BYTES = 123
"""RFC 6455 §5.5: a control frame's payload is at most 125 bytes, 2 of them the code."""


def close_reason(text: str) -> str:
    """``text`` cut to fit a close frame (123 UTF-8 bytes), never inside a character:
    reasons quote client input (an app key from the URL), which may be anything."""
    data = text.encode()
    if len(data) <= MAX_CLOSE_REASON_BYTES:
        return text
    return data[:MAX_CLOSE_REASON_BYTES].decode(errors="ignore")


_FIN_TEXT = 0x81
# Compiled once: struct.pack with a format string looks the format up on every call.
_HEADER_16 = struct.Struct("!BBH").pack
_HEADER_64 = struct.Struct("!BBQ").pack


def text_frame(payload: bytes) -> bytes:
    """The complete WebSocket text frame (RFC 6455 §5.2) carrying ``payload``."""
    size = len(payload)
    if size < 126:
        header = bytes((_FIN_TEXT, size))
    elif size < 1 << 16:
        header = _HEADER_16(_FIN_TEXT, 126, size)
    else:
        header = _HEADER_64(_FIN_TEXT, 127, size)
    return header + payload


class PreparedMessage:
    """One server message: its JSON ``payload``, the raw ``frame`` (fast path) built
    with it, and the ``text`` (ASGI fallback, SSE) built on first use and then shared."""

    __slots__ = ("_text", "frame", "payload")

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        # text_frame(payload), inlined: every publication makes one, and nearly every
        # message goes out as a frame (a property and a call per message showed).
        size = len(payload)
        if size < 126:
            self.frame = bytes((_FIN_TEXT, size)) + payload
        elif size < 1 << 16:
            self.frame = _HEADER_16(_FIN_TEXT, 126, size) + payload
        else:
            self.frame = _HEADER_64(_FIN_TEXT, 127, size) + payload
        self._text: str | None = None

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = self.payload.decode()
        return self._text

    def __len__(self) -> int:
        return len(self.payload)
