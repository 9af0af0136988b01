"""Channel names: validation and kinds."""

from __future__ import annotations

import pytest

from broadcaster.channels import (
    ChannelKind,
    channel_kind,
    is_client_event,
    is_encrypted,
    validate_channel_name,
)
from broadcaster.codes import ErrorCode
from broadcaster.exceptions import ProtocolError


@pytest.mark.parametrize(
    "name",
    [
        "agent.1234",
        "private-agent.abc_def",
        "presence-agent.x",
        "a",
        "A-Z_a-z=0@9,.;",
        "x" * 164,
    ],
)
def test_valid_names_are_returned_unchanged(name: str) -> None:
    assert validate_channel_name(name) == name


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("", "empty"),
        ("x" * 165, "165 characters long; the limit is 164"),
        ("agent 1", "contains ' '"),
        ("agent/1", "contains '/'"),
        ("agent#1", "contains '#'"),
        ("é", "contains 'é'"),
        (None, "must be a string, got NoneType"),
        (12, "must be a string, got int"),
    ],
)
def test_invalid_names_raise_invalid_channel_saying_why(name: object, fragment: str) -> None:
    with pytest.raises(ProtocolError) as info:
        validate_channel_name(name)
    assert info.value.code is ErrorCode.INVALID_CHANNEL
    assert not info.value.close
    assert fragment in info.value.message


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("agent.1", ChannelKind.PUBLIC),
        ("privateer", ChannelKind.PUBLIC),
        ("private-agent.1", ChannelKind.PRIVATE),
        ("private-encrypted-agent.1", ChannelKind.PRIVATE),
        ("presence-agent.1", ChannelKind.PRESENCE),
    ],
)
def test_kind_comes_from_the_prefix(name: str, kind: ChannelKind) -> None:
    assert channel_kind(name) is kind
    assert kind.needs_auth == (kind is not ChannelKind.PUBLIC)


def test_encrypted_channels_are_private_channels_marked_encrypted() -> None:
    assert is_encrypted("private-encrypted-x")
    assert not is_encrypted("private-x")


def test_client_events_start_with_client_dash() -> None:
    assert is_client_event("client-typing")
    assert not is_client_event("typing")
    assert not is_client_event("pusher:subscribe")
