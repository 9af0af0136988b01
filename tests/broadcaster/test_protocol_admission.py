"""The pure admission checks and presence notices of the sans-I/O protocol module,
tested synchronously with literal values (no socket, no node)."""

from __future__ import annotations

import orjson
import pytest

from broadcaster.codes import ErrorCode
from broadcaster.exceptions import ProtocolError
from broadcaster.protocol import (
    MEMBER_ADDED,
    MEMBER_REMOVED,
    PROTOCOL_VERSION,
    PresenceMember,
    check_channel_limit,
    check_origin,
    check_protocol_version,
    member_added,
    member_added_notice,
    member_removed,
    member_removed_notice,
)
from broadcaster.settings import AppConfig

APP = AppConfig(id="3", key="k", secret="s")
STRICT = AppConfig(
    id="4",
    key="k4",
    secret="s",
    allowed_origins=("https://app.example", "*.trusted.example"),
    max_channels_per_connection=2,
)


def _refused(check: object, *args: object) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        check(*args)  # type: ignore[operator]
    return caught.value


@pytest.mark.parametrize("version", ["7", "07", "0007"])
def test_protocol_version_7_is_admitted(version: str) -> None:
    check_protocol_version(version)
    assert PROTOCOL_VERSION == 7


@pytest.mark.parametrize(
    ("version", "code"),
    [
        (None, ErrorCode.NO_PROTOCOL_VERSION),
        ("seven", ErrorCode.INVALID_VERSION),
        ("7.0", ErrorCode.INVALID_VERSION),
        ("\u0667", ErrorCode.INVALID_VERSION),  # an Arabic-Indic seven: a digit, not ASCII
        ("5", ErrorCode.UNSUPPORTED_PROTOCOL),
        ("7" * 5000, ErrorCode.UNSUPPORTED_PROTOCOL),
    ],
)
def test_other_protocol_versions_are_refused_with_their_code(
    version: str | None, code: ErrorCode
) -> None:
    exc = _refused(check_protocol_version, version)
    assert exc.code == code
    assert exc.close
    assert "protocol=7" in exc.message
    assert len(exc.message) < 300  # a long value is excerpted


def test_any_origin_is_admitted_by_default_even_none() -> None:
    check_origin(APP, None)
    check_origin(APP, "https://anything.example")


@pytest.mark.parametrize(
    "origin", ["https://app.example", "https://a.trusted.example", "HTTPS://APP.EXAMPLE"]
)
def test_allowed_origins_match_whole_origins_and_host_patterns(origin: str) -> None:
    check_origin(STRICT, origin)


@pytest.mark.parametrize(
    "origin", [None, "https://evil.example", "https://trusted.example", "http://app.example"]
)
def test_other_origins_are_refused_with_4009(origin: str | None) -> None:
    exc = _refused(check_origin, STRICT, origin)
    assert exc.code == ErrorCode.UNAUTHORIZED
    assert exc.close
    assert "allowed: https://app.example, *.trusted.example" in exc.message


@pytest.mark.parametrize(
    "origin",
    [
        "https://evil.com/.partner.example",
        "http://a.partner.example",
        "https://a.partner.example:8443",
    ],
)
def test_an_origin_pattern_is_matched_as_scheme_host_and_port(origin: str) -> None:
    """``*.partner.example`` was matched with fnmatch against the whole Origin and its
    host: it admitted a path that ends like it, ``http://`` and any port."""
    partner = AppConfig(id="5", key="k5", secret="s", allowed_origins=("*.partner.example",))
    check_origin(partner, "https://a.partner.example")
    assert _refused(check_origin, partner, origin).code == ErrorCode.UNAUTHORIZED


def test_the_channel_limit_admits_up_to_the_limit_and_refuses_beyond() -> None:
    check_channel_limit(STRICT, 1, "a")
    exc = _refused(check_channel_limit, STRICT, 2, "c")
    assert exc.code == ErrorCode.TOO_MANY_CHANNELS
    assert not exc.close
    assert exc.channel == "c"
    assert "2 subscriptions" in exc.message


def test_presence_notices_carry_what_the_frames_carry() -> None:
    """The notice published through the backend and the frame built directly agree."""
    member = PresenceMember("42", {"name": "Ada"})
    added = member_added_notice(member)
    assert added.event == MEMBER_ADDED == "pusher_internal:member_added"
    assert orjson.loads(added.data) == {"user_id": "42", "user_info": {"name": "Ada"}}
    frame = orjson.loads(member_added("presence-a", "42", {"name": "Ada"}))
    assert (frame["event"], frame["data"]) == (added.event, added.data)
    removed = member_removed_notice("42")
    assert removed.event == MEMBER_REMOVED == "pusher_internal:member_removed"
    frame = orjson.loads(member_removed("presence-a", "42"))
    assert (frame["event"], frame["data"]) == (removed.event, removed.data)
