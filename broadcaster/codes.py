"""Pusher error and close codes, and the ones this server adds.

Pusher's ranges tell a client what to do when the connection is closed with a code:
4000-4099 do not reconnect with the same parameters; 4100-4199 reconnect after a back-off
(1 s or more); 4200-4299 reconnect now; 4300-4399 any other error. pusher-js acts on the
close code only; the code in a ``pusher:error`` message is informative.

=====  =========================  ======  ===================================================
Code   Name                       Closes  When
=====  =========================  ======  ===================================================
4001   APP_NOT_FOUND              yes     no app has the key in ``/app/{key}``
4003   APP_DISABLED               yes     the app is disabled
4004   OVER_QUOTA                 yes     the app already has ``max_connections`` connections
                                          (on every node sharing the Redis backend)
4005   PATH_NOT_FOUND             yes     the WebSocket path is not ``/app/{key}``
4006   INVALID_VERSION            yes     ``protocol`` is not a number
4007   UNSUPPORTED_PROTOCOL       yes     ``protocol`` is not 7
4008   NO_PROTOCOL_VERSION        yes     the ``protocol`` query parameter is missing
4009   UNAUTHORIZED               yes     the Origin is not allowed, or ``pusher:signin``
                                          failed (missing or unreadable data, bad
                                          signature or bad ``user_data``)
4100   OVER_CAPACITY              yes     the server is full, the client reads too slowly
                                          (SLOW_CONSUMER), a subscribe's backend work
                                          failed (history not read), a channel's missed
                                          publications could not be read again (resume
                                          from the last position), or a connection of an
                                          app with ``max_connections`` could not be counted
                                          (Redis away): reconnect with back-off
4200   SERVER_CLOSING             yes     the server shuts down or restarts: reconnect now
4201   PONG_NOT_RECEIVED          yes     no ``pusher:pong`` after the server's ``pusher:ping``
4202   CLOSED_AFTER_INACTIVITY    yes     nothing received for longer than activity_timeout
4300   INVALID_MESSAGE            no      not UTF-8 JSON, not an object, nested too deeply,
                                          a field missing or of the wrong type
4301   CLIENT_EVENT_RATE_LIMIT    no      more client events per second than the app allows;
                                          the event is dropped
4302   MESSAGE_TOO_LARGE          no      the message is larger than ``max_message_size``
4303   UNKNOWN_EVENT              no      an unknown ``pusher:`` event, or an event that is
                                          neither ``pusher:*`` nor ``client-*``
4304   INVALID_CHANNEL            no      the channel is missing or its name is invalid
4305   CLIENT_EVENT_REJECTED      no      client events are disabled for the app, or sent on
                                          a public channel or one the client has not joined
4306   INVALID_CHANNEL_DATA       no      presence ``channel_data`` is not a JSON object with
                                          a ``user_id``, or is too large
4307   PRESENCE_MEMBER_LIMIT      no      the presence channel has ``max_presence_members``
4308   TOO_MANY_CHANNELS          no      the connection already has
                                          ``max_channels_per_connection`` subscriptions
4309   SUBSCRIPTION_RATE_LIMIT    no      more subscribes than the app allows
                                          (``subscription_rate_limit`` a second after a
                                          burst of ``max_channels_per_connection`` plus
                                          that rate),
                                          sent as ``pusher:subscription_error`` (status
                                          429); subscribe again later
4009   SUBSCRIPTION_UNAUTHORIZED  no      the ``auth`` of a private or presence subscription
                                          is missing or wrong, or ``channel_data`` was sent
                                          on a private channel: 4009 as Reverb answers it, but
                                          sent as ``pusher:subscription_error`` on the channel
                                          and the connection stays open
=====  =========================  ======  ===================================================

The slow-consumer code is ``SLOW_CONSUMER`` = ``OVER_CAPACITY`` (4100): a connection
whose send queue overflows is closed with 4100 and pusher-js reconnects after a back-off.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["SLOW_CONSUMER", "CloseCode", "ErrorCode"]


class ErrorCode(IntEnum):
    """A Pusher error / close code (see the module docstring for the full table)."""

    APP_NOT_FOUND = 4001
    APP_DISABLED = 4003
    OVER_QUOTA = 4004
    PATH_NOT_FOUND = 4005
    INVALID_VERSION = 4006
    UNSUPPORTED_PROTOCOL = 4007
    NO_PROTOCOL_VERSION = 4008
    UNAUTHORIZED = 4009
    OVER_CAPACITY = 4100
    SERVER_CLOSING = 4200
    PONG_NOT_RECEIVED = 4201
    CLOSED_AFTER_INACTIVITY = 4202
    INVALID_MESSAGE = 4300
    CLIENT_EVENT_RATE_LIMIT = 4301
    MESSAGE_TOO_LARGE = 4302
    UNKNOWN_EVENT = 4303
    INVALID_CHANNEL = 4304
    CLIENT_EVENT_REJECTED = 4305
    INVALID_CHANNEL_DATA = 4306
    PRESENCE_MEMBER_LIMIT = 4307
    TOO_MANY_CHANNELS = 4308
    SUBSCRIPTION_RATE_LIMIT = 4309
    SUBSCRIPTION_UNAUTHORIZED = 4009  # an alias of UNAUTHORIZED; raised with close=False

    @property
    def closes_connection(self) -> bool:
        """Whether the server closes the connection with this code (4000-4299) rather
        than sending it in a ``pusher:error`` and keeping the connection (4300-4399)."""
        return self < 4300

    @property
    def reconnect(self) -> str:
        """What a client should do after a close with this code: ``"never"`` (4000-4099,
        not with the same parameters), ``"backoff"`` (4100-4199) or ``"now"`` (4200+)."""
        if self < 4100:
            return "never"
        return "backoff" if self < 4200 else "now"


SLOW_CONSUMER = ErrorCode.OVER_CAPACITY
"""The code a connection is closed with when it cannot keep up with its send queue."""


class CloseCode(IntEnum):
    """The WebSocket close codes of RFC 6455 the server sends (below the Pusher ones)."""

    INVALID_PAYLOAD = 1007
    """A text message is not valid UTF-8."""
    MESSAGE_TOO_BIG = 1009
    """A message over the frame limit, refused from its frame header (the
    ``websockets`` parser sends it; named here for the tests and the docs)."""
    INTERNAL_ERROR = 1011
    """The server met an unexpected condition."""
