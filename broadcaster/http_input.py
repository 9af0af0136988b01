"""Bounded HTTP input: request bodies read under a size and time limit, and error
answers that quote client input only as a short excerpt.

Every endpoint that reads a body (the HTTP API, the demo's ``POST /run`` and
``/broadcasting/auth``, AG-UI) reads it through :func:`read_body` (the HTTP API's publish
fast path through :class:`BodyReader`, the same without a ``Request``): a declared
``Content-Length`` over the limit is refused before reading, a body that grows over it
is refused as soon as it does (nothing past the limit is kept), and a body that does not
arrive within the time limit is refused too, and so is one whose client goes away before
its end (:class:`ClientGone`: the answer reaches nobody). Error messages and 422 details
never carry more than :data:`EXCERPT` characters of what the client sent
(:func:`excerpt`, :func:`validation_details`), so an answer stays small whatever the
request was.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive

from broadcaster._text import EXCERPT_LENGTH, excerpt

__all__ = [
    "EXCERPT",
    "MAX_DETAILS",
    "BodyReader",
    "BodyRefused",
    "ClientGone",
    "describe_validation",
    "excerpt",
    "read_body",
    "validation_details",
]

EXCERPT = EXCERPT_LENGTH

MAX_DETAILS = 10
"""Validation errors listed in a 422 answer (a count says how many more there were)."""


class BodyRefused(Exception):
    """The request body was not read: ``status`` is 413 (too large) or 408 (too slow),
    the message says which limit and its setting."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ClientGone(BodyRefused):
    """The client went away before the end of its body: there is nobody to answer.

    A refusal like the others, so that an endpoint stops before acting on part of a body
    (no run is started from half a ``POST /run``), and its answer goes nowhere: the
    server drops what is sent on a closed connection. Without it, Starlette's
    :class:`~starlette.requests.ClientDisconnect` would reach the server, which logs it
    as an error with its traceback, a line any client could have written at will.
    ``status`` is 499, nginx's "client closed request".
    """

    def __init__(self) -> None:
        super().__init__(499, "the client went away before the end of the request body")


async def read_body(request: Request, limit: int, within: float) -> bytes:
    """The body of ``request``, at most ``limit`` bytes, arrived within ``within`` seconds.

    Args:
        request: the request whose body to read (streamed, not buffered whole first).
        limit: the largest body accepted, in bytes (``max_request_bytes``).
        within: seconds the whole body may take to arrive (``body_timeout``).

    Raises:
        BodyRefused: 413 for a ``Content-Length`` or a body over ``limit`` (the rest is
            not read), 408 when the body does not arrive in time, :class:`ClientGone`
            (499) when the client goes away before its end.
    """
    _check_declared(request.headers.get("content-length", ""), limit)
    try:
        async with asyncio.timeout(within):
            return await _read(request, limit)
    except TimeoutError:
        raise _too_slow(within) from None
    except ClientDisconnect:
        raise ClientGone() from None


class BodyReader:
    """:func:`read_body` for a plain ASGI callable (no :class:`~starlette.requests.Request`):
    the same limits, refusals and messages, from the scope's ``headers`` and ``receive``.

    The deadlines of all the bodies being read share one timer, re-armed only when it
    fires, instead of one ``asyncio.timeout`` (a timer armed and disarmed) per request.
    """

    def __init__(self, limit: int, within: float) -> None:
        self.limit = limit
        self.within = within
        # Tasks reading a body, by deadline (inserted in deadline order: one ``within``).
        self._reading: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None

    async def read(self, headers: Sequence[tuple[bytes, bytes]], receive: Receive) -> bytes:
        """The body, at most ``limit`` bytes, arrived within ``within`` seconds.

        Raises:
            BodyRefused: as :func:`read_body`.
            starlette.requests.ClientDisconnect: the client went away before the end of
                the body.
        """
        for name, value in headers:
            if name == b"content-length":  # the first one, as Request.headers.get
                self.check_length(value.decode("latin-1"))
                break
        loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None
        deadline = loop.time() + self.within
        self._reading[task] = deadline
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._expire)
        try:
            return await _receive(receive, self.limit)
        except asyncio.CancelledError:
            if task not in self._expired:
                raise
            task.uncancel()
            raise _too_slow(self.within) from None
        finally:
            del self._reading[task]
            self._expired.discard(task)

    def check_length(self, declared: str) -> None:
        """Refuse a declared ``Content-Length`` over the limit before reading the body.

        Raises:
            BodyRefused: 413, as :func:`read_body`.
        """
        _check_declared(declared, self.limit)

    def too_slow(self) -> BodyRefused:
        """The refusal of a body that did not arrive within ``within`` (408)."""
        return _too_slow(self.within)

    def _expire(self) -> None:
        # A task still listed is suspended in read() (it leaves the list as soon as its
        # body is read), so its cancellation lands there.
        self._timer = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        for task, deadline in self._reading.items():
            if deadline > now:
                self._timer = loop.call_at(deadline, self._expire)
                return
            if task not in self._expired:
                self._expired.add(task)
                task.cancel()


def _check_declared(declared: str, limit: int) -> None:
    if declared.isascii() and declared.isdigit():
        # No int() of thousands of digits: 19 digits or more is over any limit.
        size = int(declared) if len(declared) <= 18 else 10**18
        if size > limit:
            raise _too_large(size, limit)


async def _receive(receive: Receive, limit: int) -> bytes:
    # As Request.stream(): http.request messages until more_body is false.
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.request":
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _too_large(size, limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        elif message["type"] == "http.disconnect":
            raise ClientDisconnect()


def _too_slow(within: float) -> BodyRefused:
    return BodyRefused(408, f"the request body did not arrive within {within:g} s (body_timeout)")


async def _read(request: Request, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, limit: int) -> BodyRefused:
    return BodyRefused(
        413,
        f"request body is {size} bytes or more; the limit is {limit} bytes (max_request_bytes)",
    )


def validation_details(exc: ValidationError, most: int = MAX_DETAILS) -> list[dict[str, Any]]:
    """pydantic's errors for a 422 answer, without the input they were about: at most
    ``most`` of them, each with ``type``, ``loc`` (names cut to excerpts) and ``msg``."""
    errors = exc.errors(include_url=False, include_context=False, include_input=False)
    details: list[dict[str, Any]] = [
        {"type": error["type"], "loc": _loc(error["loc"]), "msg": error["msg"][:200]}
        for error in errors[:most]
    ]
    if len(errors) > most:
        details.append({"type": "more_errors", "loc": [], "msg": f"{len(errors) - most} more"})
    return details


def describe_validation(exc: ValidationError, what: str) -> str:
    """One line for the first of ``exc``'s errors: ``"invalid <what>: <where>: <msg>"``."""
    first = validation_details(exc, most=1)[0]
    where = ".".join(str(part) for part in first["loc"]) or "body"
    return f"invalid {what}: {where}: {first['msg']}"


def _loc(loc: Sequence[int | str]) -> list[int | str]:
    # A location can be a key the client chose (an unknown field): cut it too.
    return [part if isinstance(part, int) else _cut(part) for part in loc[:8]]


def _cut(text: str) -> str:
    return text if len(text) <= EXCERPT else text[:EXCERPT] + "..."
