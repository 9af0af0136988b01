"""Exceptions raised by the broadcaster.

The hierarchy::

    BroadcasterError                 base of every error the server raises on purpose
     ├── ProtocolError (ValueError)  a WebSocket client broke the Pusher protocol:
     │                               carries the ErrorCode to send in ``pusher:error``
     │                               (or as close code) and whether to close
     └── ApiError                    an HTTP API request is refused: carries the HTTP
                                     status (400, 401, 403, 413) and the message for
                                     the JSON error body

Every message says what was wrong and, where it helps, what to send instead.
"""

from __future__ import annotations

from broadcaster.codes import ErrorCode

__all__ = ["ApiError", "BroadcasterError", "ProtocolError"]


class BroadcasterError(Exception):
    """Base class of the errors the broadcaster raises on purpose."""


class ProtocolError(BroadcasterError, ValueError):
    """A client message or value breaks the Pusher protocol.

    Args:
        code: the code to send to the client (``pusher:error`` data or close code).
        message: what is wrong, in words a client developer can act on.
        close: whether the connection must be closed with ``code``; defaults to
            ``code.closes_connection``.
        channel: the (valid) channel a failed ``pusher:subscribe`` named, so the server
            can answer with ``pusher:subscription_error`` on that channel.
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        close: bool | None = None,
        channel: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.close = code.closes_connection if close is None else close
        self.channel = channel

    def __repr__(self) -> str:
        return f"ProtocolError({self.code.name}, {self.message!r}, close={self.close})"


class ApiError(BroadcasterError):
    """An HTTP API request is refused.

    Args:
        status: the HTTP status: 400 bad request, 401 authentication failed,
            403 forbidden (app disabled), 413 payload too large.
        message: what is wrong with the request.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.message!r})"

    def body(self) -> dict[str, object]:
        """The JSON error body: ``{"error": message, "status": status}``."""
        return {"error": self.message, "status": self.status}
