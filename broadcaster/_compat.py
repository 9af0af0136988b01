"""Whether the installed uvicorn still has what the fast path and the guard rely on.

:mod:`broadcaster._uvicorn` subclasses uvicorn's private ``WebSocketsSansIOProtocol``
and :mod:`broadcaster._guard` subclasses its ``HttpToolsProtocol``: both use methods and
instance attributes that uvicorn does not promise to keep. Before the server hands
either class to uvicorn, :func:`fast_path_problems` and :func:`guard_problems` check
that every module, class, method and attribute named below exists (attributes: assigned
as ``self.name`` somewhere in the class or its bases, read from the source, since they
exist only on instances). When a check fails the server logs a warning naming what is
missing and falls back to uvicorn's own implementation: the plain ASGI WebSocket path
(no direct frame writes, no native handlers, 1012 instead of 4200 on shutdown), or
uvicorn's HTTP protocol without the head deadline, head size and per-address limits
(and without the natively served publish routes).

The lists are the contract: tests/broadcaster/test_compat.py checks each name against
the installed uvicorn, so an upgrade that removes one fails a test before it fails a
server.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import logging
import textwrap
from dataclasses import dataclass

__all__ = ["GUARD", "WEBSOCKET", "Contract", "fast_path_problems", "guard_problems"]

log = logging.getLogger("broadcaster.server")


@dataclass(frozen=True)
class Contract:
    """What a subclass relies on in one class of another package."""

    module: str
    cls: str
    methods: tuple[str, ...]
    attributes: tuple[str, ...] = ()

    def problems(self) -> list[str]:
        """What is missing, as readable phrases; empty when everything is there."""
        where = f"{self.module}.{self.cls}"
        try:
            found = getattr(importlib.import_module(self.module), self.cls)
        except (ImportError, AttributeError) as exc:
            return [f"{where} cannot be imported ({exc})"]
        if not isinstance(found, type):
            return [f"{where} is not a class"]
        missing = [f"{where}.{name}()" for name in self.methods if not _has_method(found, name)]
        assigned = instance_attributes(found)
        missing += [f"{where}.{name}" for name in self.attributes if name not in assigned]
        return missing


def _has_method(cls: type, name: str) -> bool:
    return callable(getattr(cls, name, None))


@functools.cache
def instance_attributes(cls: type) -> frozenset[str]:
    """Names assigned as ``self.<name>`` in the methods of ``cls`` and its bases, plus
    its class attributes; empty for a class whose source cannot be read. Read once per
    class and process (a server started again in the same process reads nothing)."""
    names: set[str] = set()
    for klass in cls.__mro__[:-1]:
        names.update(vars(klass))
        try:
            tree = _parsed(klass)
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                names.add(node.attr)
    return frozenset(names)


def _parsed(klass: type) -> ast.Module:
    """The syntax tree of ``klass``'s source.

    CPython 3.11 can raise ``SystemError: AST constructor recursion depth mismatch``
    from a valid parse (python/cpython#106905; seen here on 3.11.7, in a test run that
    started a server in-process many times): the parse is tried once more before the
    error stands."""
    for attempt in (1, 2):
        try:
            return ast.parse(_source(klass))
        except SystemError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _source(klass: type) -> str:
    return textwrap.dedent(inspect.getsource(klass))  # inspect parses the module too


WEBSOCKET = (
    Contract(
        module="uvicorn.protocols.websockets.websockets_sansio_impl",
        cls="WebSocketsSansIOProtocol",
        methods=(
            "connection_lost",
            "connection_made",
            "data_received",
            "handle_connect",
            "handle_cont",
            "handle_parser_exception",
            "handle_ping",
            "on_task_complete",
            "pause_writing",
            "resume_writing",
            "send_receive_event_to_app",
            "shutdown",
            "stop_keepalive",
        ),
        attributes=(
            "app_state",
            "client",
            "close_sent",
            "close_timer",
            "conn",
            "curr_msg_data_type",
            "default_headers",
            "disconnected",
            "frames",
            "handshake_complete",
            "handshake_initiated",
            "initial_response",
            "logger",
            "loop",
            "queue",
            "read_paused",
            "response",
            "scope",
            "server",
            "tasks",
            "transport",
            "writable",
        ),
    ),
    Contract(
        module="websockets.server",
        cls="ServerProtocol",
        methods=("accept", "data_to_send", "send_close", "send_response"),
        attributes=("handshake_exc", "max_message_size"),
    ),
)
"""What :class:`broadcaster._uvicorn.FastWebSocketProtocol` relies on."""

GUARD = (
    Contract(
        module="uvicorn.protocols.http.httptools_impl",
        cls="HttpToolsProtocol",
        methods=(
            "connection_lost",
            "connection_made",
            "data_received",
            "handle_websocket_upgrade",
            "on_body",
            "on_headers_complete",
            "on_message_begin",
            "on_message_complete",
            "on_response_complete",
            "shutdown",
            "_start_asgi_task",
            "_unset_keepalive_if_required",
        ),
        attributes=(
            "access_log",
            "access_logger",
            "app_state",
            "client",
            "cycle",
            "expect_100_continue",
            "flow",
            "headers",
            "limit_concurrency",
            "logger",
            "loop",
            "parser",
            "pipeline",
            "root_path",
            "scope",
            "server_state",
            "timeout_keep_alive",
            "transport",
            "url",
        ),
    ),
    # A natively served request stands in for this class as the protocol's ``cycle``
    # (broadcaster._guard._NativeCycle): these are what uvicorn reads and writes there.
    # An SSE stream that stalls is dropped through ``receive.__self__.transport``
    # (broadcaster.sse._abort).
    Contract(
        module="uvicorn.protocols.http.httptools_impl",
        cls="RequestResponseCycle",
        methods=("receive",),
        attributes=(
            "disconnected",
            "keep_alive",
            "message_event",
            "response_complete",
            "transport",
        ),
    ),
    Contract(
        module="uvicorn.server",
        cls="ServerState",
        methods=(),
        attributes=("default_headers",),
    ),
    Contract(
        module="httptools",
        cls="HttpRequestParser",
        methods=("get_http_version", "get_method", "should_keep_alive", "should_upgrade"),
    ),
)
"""What :class:`broadcaster._guard.GuardedHttpProtocol` relies on."""


def _problems(contracts: tuple[Contract, ...]) -> list[str]:
    return [problem for contract in contracts for problem in contract.problems()]


def fast_path_problems() -> list[str]:
    """What the fast WebSocket path misses in the installed packages (empty: usable)."""
    return _problems(WEBSOCKET)


def guard_problems() -> list[str]:
    """What the connection guard misses in the installed uvicorn (empty: usable)."""
    return _problems(GUARD)


def warn_fallback(what: str, problems: list[str], instead: str) -> None:
    """Log once, at start-up, that ``what`` is off because of ``problems``."""
    log.warning(
        "%s is off: the installed uvicorn lacks %s; serving with %s instead "
        "(pin uvicorn to a version the tests pass with to get it back)",
        what,
        ", ".join(problems),
        instead,
    )
