"""A raw WebSocket client on a blocking socket, for a client that stops reading: its
receive buffer is kept small (no autotuning) so that the server's outgoing buffer is what
fills up, and it reads nothing until the test says so."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
from dataclasses import dataclass
from urllib.parse import urlsplit


def masked_text_frame(payload: bytes) -> bytes:
    """A client-to-server text frame (clients must mask, RFC 6455 §5.3)."""
    size = len(payload)
    if size < 126:
        header = bytes((0x81, 0x80 | size))
    elif size < 1 << 16:
        header = struct.pack("!BBH", 0x81, 0x80 | 126, size)
    else:
        header = struct.pack("!BBQ", 0x81, 0x80 | 127, size)
    mask = os.urandom(4)
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


@dataclass
class Frame:
    opcode: int
    payload: bytes


class RawClient:
    """Connects to ``ws://host:port/path`` with a ``rcvbuf``-byte receive buffer."""

    def __init__(self, url: str, rcvbuf: int = 16384) -> None:
        parts = urlsplit(url)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(10)
        self.sock.connect((parts.hostname, parts.port))
        key = base64.b64encode(os.urandom(16)).decode()
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        request = (
            f"GET {target} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        self.sock.sendall(request.encode())
        self.buffer = b""
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise ConnectionError("closed during the handshake")
            self.buffer += chunk
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head

    def send_json(self, message: object) -> None:
        self.sock.sendall(masked_text_frame(json.dumps(message).encode()))

    def next_frame(self) -> Frame | None:
        """The next frame, or None at the end of the stream."""
        while True:
            frame = self._parse()
            if frame is not None:
                return frame
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                return None
            if not chunk:
                return None
            self.buffer += chunk

    def _parse(self) -> Frame | None:
        data = self.buffer
        if len(data) < 2:
            return None
        opcode, size, start = data[0] & 0x0F, data[1] & 0x7F, 2
        if size == 126:
            if len(data) < 4:
                return None
            size, start = struct.unpack("!H", data[2:4])[0], 4
        elif size == 127:
            if len(data) < 10:
                return None
            size, start = struct.unpack("!Q", data[2:10])[0], 10
        if len(data) < start + size:
            return None
        self.buffer = data[start + size :]
        return Frame(opcode, data[start : start + size])

    def read_until_close(self) -> tuple[int, int | None]:
        """Read everything: the number of data frames before the close, and its code."""
        frames = 0
        while True:
            frame = self.next_frame()
            if frame is None:
                return frames, None
            if frame.opcode == 0x8:
                code = struct.unpack("!H", frame.payload[:2])[0] if frame.payload else None
                return frames, code
            frames += 1

    def close(self) -> None:
        self.sock.close()


def masked_frame(opcode: int, payload: bytes) -> bytes:
    """A client frame with any ``opcode`` (1 text, 2 binary) and unchecked payload."""
    frame = masked_text_frame(payload)
    return bytes((0x80 | opcode,)) + frame[1:]
