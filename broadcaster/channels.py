"""Channel names and kinds.

A channel name is 1 to 164 characters of ``A-Z a-z 0-9 _ - = @ , . ;``. Its prefix gives
its kind: ``private-`` and ``private-encrypted-`` channels need a signed ``auth`` to
subscribe, ``presence-`` channels need one plus ``channel_data`` naming the member; all
other channels are public. For ``private-encrypted-`` channels the payload is encrypted
and decrypted by the clients (end-to-end, keys from the app's auth endpoint): to the
server they are private channels whose data it never reads.
"""

from __future__ import annotations

import re
from enum import Enum

from broadcaster.codes import ErrorCode
from broadcaster.exceptions import ProtocolError

__all__ = [
    "CLIENT_EVENT_PREFIX",
    "MAX_CHANNEL_NAME_LENGTH",
    "SERVER_TO_USER_PREFIX",
    "ChannelKind",
    "channel_kind",
    "is_client_event",
    "is_encrypted",
    "server_to_user_id",
    "validate_channel_name",
]

MAX_CHANNEL_NAME_LENGTH = 164
CLIENT_EVENT_PREFIX = "client-"
SERVER_TO_USER_PREFIX = "#server-to-user-"
"""Pusher's per-user channel: ``#server-to-user-<user id>``, joined (without auth) by a
connection signed in as that user, and the target of the SDKs' ``send_to_user``."""

_NAME = re.compile(r"[A-Za-z0-9_\-=@,.;]+")
_ALLOWED = "letters, digits and _ - = @ , . ;"


class ChannelKind(Enum):
    """What a subscription to a channel requires."""

    PUBLIC = "public"
    """Anyone with the app key may subscribe."""
    PRIVATE = "private"
    """``private-*`` and ``private-encrypted-*``: a signed ``auth`` is required."""
    PRESENCE = "presence"
    """``presence-*``: a signed ``auth`` and ``channel_data`` with a ``user_id``."""

    @property
    def needs_auth(self) -> bool:
        """Whether a subscription must carry a valid ``auth`` signature."""
        return self is not ChannelKind.PUBLIC


def channel_kind(name: str) -> ChannelKind:
    """The kind of channel ``name`` (from its prefix; the name is not validated)."""
    if name.startswith("presence-"):
        return ChannelKind.PRESENCE
    if name.startswith("private-"):
        return ChannelKind.PRIVATE
    return ChannelKind.PUBLIC


def is_encrypted(name: str) -> bool:
    """Whether ``name`` is an end-to-end encrypted channel (``private-encrypted-*``)."""
    return name.startswith("private-encrypted-")


def is_client_event(event: str) -> bool:
    """Whether ``event`` is a client event name (``client-*``)."""
    return event.startswith(CLIENT_EVENT_PREFIX)


def server_to_user_id(name: str) -> str | None:
    """The user id of a ``#server-to-user-<id>`` channel, else None."""
    if name.startswith(SERVER_TO_USER_PREFIX):
        return name[len(SERVER_TO_USER_PREFIX) :]
    return None


def validate_channel_name(name: object) -> str:
    """Check that ``name`` is a valid channel name and return it.

    Raises:
        ProtocolError: ``INVALID_CHANNEL`` saying what is wrong (not a string, empty,
            too long, or which character is not allowed).
    """
    if not isinstance(name, str):
        raise _invalid(f"channel name must be a string, got {type(name).__name__}")
    if not name:
        raise _invalid("channel name is empty")
    if len(name) > MAX_CHANNEL_NAME_LENGTH:
        raise _invalid(
            f"channel name is {len(name)} characters long; "
            f"the limit is {MAX_CHANNEL_NAME_LENGTH}: {name[:40]!r}..."
        )
    rest = server_to_user_id(name)
    if rest is not None and not rest:
        raise _invalid(f"channel name {name!r} names no user after {SERVER_TO_USER_PREFIX!r}")
    checked = name if rest is None else rest
    if _NAME.fullmatch(checked) is None:
        bad = next(ch for ch in checked if _NAME.fullmatch(ch) is None)
        raise _invalid(f"channel name {name!r} contains {bad!r}; use only {_ALLOWED}")
    return name


def _invalid(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_CHANNEL, f"invalid channel: {message}")
