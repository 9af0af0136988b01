"""Error codes: Pusher's values and what each tells a client to do."""

from __future__ import annotations

import pytest

from broadcaster import codes
from broadcaster._frames import close_reason
from broadcaster.codes import SLOW_CONSUMER, ErrorCode
from broadcaster.exceptions import ApiError, BroadcasterError, ProtocolError


@pytest.mark.parametrize(
    ("code", "value"),
    [
        (ErrorCode.APP_NOT_FOUND, 4001),
        (ErrorCode.APP_DISABLED, 4003),
        (ErrorCode.OVER_QUOTA, 4004),
        (ErrorCode.PATH_NOT_FOUND, 4005),
        (ErrorCode.INVALID_VERSION, 4006),
        (ErrorCode.UNSUPPORTED_PROTOCOL, 4007),
        (ErrorCode.NO_PROTOCOL_VERSION, 4008),
        (ErrorCode.UNAUTHORIZED, 4009),
        (ErrorCode.OVER_CAPACITY, 4100),
        (ErrorCode.SERVER_CLOSING, 4200),
        (ErrorCode.PONG_NOT_RECEIVED, 4201),
        (ErrorCode.CLOSED_AFTER_INACTIVITY, 4202),
        (ErrorCode.CLIENT_EVENT_RATE_LIMIT, 4301),
    ],
)
def test_pusher_codes_have_the_protocol_values(code: ErrorCode, value: int) -> None:
    assert code == value


def test_slow_consumer_is_over_capacity_so_clients_back_off() -> None:
    assert SLOW_CONSUMER is ErrorCode.OVER_CAPACITY
    assert SLOW_CONSUMER.reconnect == "backoff"


def test_codes_below_4300_close_and_message_errors_do_not() -> None:
    assert ErrorCode.UNAUTHORIZED.closes_connection
    assert ErrorCode.SERVER_CLOSING.closes_connection
    assert not ErrorCode.INVALID_MESSAGE.closes_connection
    assert not ErrorCode.CLIENT_EVENT_RATE_LIMIT.closes_connection
    assert ErrorCode.SUBSCRIPTION_UNAUTHORIZED is ErrorCode.UNAUTHORIZED  # sent with close=False


def test_reconnect_advice_follows_pusher_ranges() -> None:
    assert ErrorCode.APP_NOT_FOUND.reconnect == "never"
    assert ErrorCode.OVER_CAPACITY.reconnect == "backoff"
    assert ErrorCode.PONG_NOT_RECEIVED.reconnect == "now"


def test_every_code_is_in_the_documented_table() -> None:
    doc = codes.__doc__ or ""
    for code in ErrorCode:
        assert f"{int(code)}   {code.name}" in doc, code


def test_protocol_error_closes_by_default_as_its_code_says() -> None:
    assert ProtocolError(ErrorCode.UNAUTHORIZED, "no").close
    assert not ProtocolError(ErrorCode.INVALID_MESSAGE, "no").close
    assert not ProtocolError(ErrorCode.UNAUTHORIZED, "no", close=False).close


def test_exceptions_share_a_base_and_protocol_errors_are_value_errors() -> None:
    err = ProtocolError(ErrorCode.INVALID_MESSAGE, "bad")
    assert isinstance(err, BroadcasterError)
    assert isinstance(err, ValueError)
    assert str(err) == "bad"
    api = ApiError(401, "bad key")
    assert isinstance(api, BroadcasterError)
    assert api.body() == {"error": "bad key", "status": 401}


@pytest.mark.parametrize(
    ("text", "expected_bytes"),
    [("short", 5), ("a" * 200, 123), ("é" * 80, 122), ("x" + "€" * 60, 121)],
)
def test_close_reasons_fit_a_close_frame_without_splitting_a_character(
    text: str, expected_bytes: int
) -> None:
    reason = close_reason(text)
    assert len(reason.encode()) == expected_bytes
    assert text.startswith(reason)


_CLOSERS = {"close", "close_now", "send_close", "_close_socket", "ProtocolError", "error"}


def _literal_codes(source: str) -> list[tuple[int, int]]:
    """``(line, value)`` of every int literal passed to a close or error call, or bound
    to a name with ``CODE`` or ``ERROR`` in it."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        values: list[ast.expr] = []
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in _CLOSERS:
                values = [*node.args, *(keyword.value for keyword in node.keywords)]
        elif isinstance(node, ast.Assign) and any(
            word in getattr(target, "id", "").upper()
            for target in node.targets
            for word in ("CODE", "ERROR")
        ):
            values = [node.value]
        found += [
            (value.lineno, value.value)
            for value in values
            if isinstance(value, ast.Constant) and type(value.value) is int
        ]
    return found


def test_the_literal_finder_finds_literal_codes() -> None:
    source = "conn.close(4100, 'x')\nSLOW_CODE = 4100\nraise ProtocolError(4009, 'm')\n"
    assert sorted(_literal_codes(source)) == [(1, 4100), (2, 4100), (3, 4009)]
    assert _literal_codes("_INTERNAL_ERROR = 1011\n") == [(1, 1011)]
    assert _literal_codes("conn.close(ErrorCode.OVER_CAPACITY, 'x')\nsize = 4096\n") == []


def test_no_close_or_error_code_is_a_literal_outside_codes() -> None:
    """Every close and error code in the server and agent_core comes from
    :mod:`broadcaster.codes` (4100 and 4200 were literals elsewhere once)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found = [
        f"{path.relative_to(root)}:{line}: {value}"
        for package in ("broadcaster", "agent_core")
        for path in sorted((root / package).rglob("*.py"))
        if path.name != "codes.py"
        for line, value in _literal_codes(path.read_text(encoding="utf-8"))
    ]
    assert found == []
