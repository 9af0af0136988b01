"""Signatures: Pusher's (channel authorization, user sign-in, signed HTTP API requests)
and the project's own (session tokens, HTTP stream authorizations).

Every signature is a hex HMAC-SHA256 and every comparison is constant-time
(:func:`hmac.compare_digest`).

Pusher's signatures are made under the raw app secret, because pusher-js backends and
the Pusher server SDKs compute them so (the protocol's test vectors must hold):

- Private channel: ``socket_id:channel``; presence channel:
  ``socket_id:channel:channel_data``. The client sends ``auth = "<app_key>:<hex
  signature>"``. ``channel_data`` counts for presence channels only: the WebSocket
  refuses it on a private channel (4009, :func:`broadcaster.protocol.authorize_subscription`),
  so text signed as ``socket_id:channel:anything`` never opens a private channel.
- User sign-in: ``socket_id::user::user_data``, ``auth`` in the same form.
- HTTP API: ``METHOD\\nPATH\\n`` followed by every query parameter but ``auth_signature``,
  keys lowercased, sorted by key, joined as ``k=v`` with ``&`` and not URL-escaped; the
  signature is sent as ``auth_signature``, next to ``auth_key``, ``auth_timestamp``,
  ``auth_version=1.0`` and, for a non-empty body, ``body_md5``.

Since one secret signs all three, whoever can have a text of their choice signed holds a
signing oracle for all of them. So a socket id must be ``<digits>.<digits>`` (ASCII, at
most :data:`MAX_SOCKET_ID_LENGTH` characters), as Pusher requires, wherever a channel or
user signature is made or checked: :func:`sign_channel`, :func:`channel_auth`,
:func:`sign_user` and :func:`user_auth` raise :class:`InvalidSocketId` for anything else,
and the ``verify_*`` functions answer False. With the socket id fixed to digits and
channel names free of ``:``, a channel or sign-in string to sign can never read as
another kind of string to sign.

The project's own signatures use keys derived per purpose,
``HMAC-SHA256(secret, "agent-broadcaster/<purpose>/v1")`` (:func:`purpose_key`), so none
of them is ever valid as a Pusher signature or as one of another purpose:

- :data:`SESSION_TOKEN`: a private session's bearer token, the signature of its id.
- :data:`STREAM_AUTH`: ``?auth=<app_key>:<signature of the channel>`` opening an HTTP
  stream (SSE, state) of a private channel (:func:`stream_auth`).
- :data:`LIST_CURSOR`: the run list's ``next_cursor``, sealed (:func:`seal`): opaque to
  its reader and refused when changed, so it names no run the reader cannot see.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import re
import time
from collections.abc import Mapping
from typing import Protocol

from broadcaster._text import excerpt
from broadcaster.exceptions import ApiError

__all__ = [
    "AUTH_VERSION",
    "LIST_CURSOR",
    "MAX_SOCKET_ID_LENGTH",
    "MAX_TIMESTAMP_DIGITS",
    "MAX_TIMESTAMP_SKEW",
    "SESSION_TOKEN",
    "STREAM_AUTH",
    "AppCredentials",
    "InvalidSocketId",
    "body_md5",
    "channel_auth",
    "channel_string_to_sign",
    "check_socket_id",
    "is_valid_socket_id",
    "purpose_key",
    "purpose_signature",
    "request_string_to_sign",
    "seal",
    "sign",
    "sign_channel",
    "sign_request",
    "sign_user",
    "signed_params",
    "stream_auth",
    "unseal",
    "user_auth",
    "user_string_to_sign",
    "verify_channel_auth",
    "verify_request",
    "verify_sdk_query",
    "verify_stream_auth",
    "verify_user_auth",
]

AUTH_VERSION = "1.0"
MAX_TIMESTAMP_SKEW = 600
"""Seconds an ``auth_timestamp`` may differ from the server's clock, either way."""
MAX_TIMESTAMP_DIGITS = 20
"""Longest ``auth_timestamp`` read as a number; longer ones are refused (401) unread."""
MAX_SOCKET_ID_LENGTH = 64
"""Longest socket id signed or accepted (ours are at most 21 characters)."""
SESSION_TOKEN = "session-token"  # noqa: S105 (a purpose label, not a secret)
"""The purpose of a private session's bearer token (:func:`purpose_key`)."""
STREAM_AUTH = "stream-auth"
"""The purpose of an HTTP stream authorization (:func:`stream_auth`)."""
LIST_CURSOR = "list-cursor"
"""The purpose of the run list's cursors (:func:`seal`)."""
_TAG = 16  # bytes of a sealed text's tag (its synthetic IV)

_SOCKET_ID = re.compile(r"[0-9]+\.[0-9]+")  # ASCII digits: \d would match any script's


class InvalidSocketId(ValueError):
    """A socket id that is not ``<digits>.<digits>``: nothing is signed for it."""


def is_valid_socket_id(value: object) -> bool:
    """Whether ``value`` is a socket id: ``"<digits>.<digits>"`` (ASCII digits), at most
    :data:`MAX_SOCKET_ID_LENGTH` characters."""
    return (
        isinstance(value, str)
        and len(value) <= MAX_SOCKET_ID_LENGTH
        and _SOCKET_ID.fullmatch(value) is not None
    )


def check_socket_id(value: str) -> str:
    """``value`` if it is a valid socket id.

    Raises:
        InvalidSocketId: saying what a socket id looks like, with an excerpt of
            ``value``.
    """
    if not is_valid_socket_id(value):
        raise InvalidSocketId(
            f"invalid socket_id {excerpt(str(value))}: a socket id is <digits>.<digits> "
            f"(at most {MAX_SOCKET_ID_LENGTH} characters), as pusher:connection_established "
            "gave it"
        )
    return value


_REQUIRED = ("auth_key", "auth_timestamp", "auth_version", "auth_signature")
# What a signed request's query names may be: the string to sign lower-cases names and
# joins "name=value" pairs with "&", unescaped, so an "INFO" or a value holding "&"
# would sign the same as another request.
_SIGNED_NAMES = re.compile(r"[a-z0-9_]+(?:&[a-z0-9_]+)*")


def sign(secret: str, text: str) -> str:
    """Hex HMAC-SHA256 of ``text`` under ``secret``."""
    return hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()


def channel_string_to_sign(socket_id: str, channel: str, channel_data: str | None = None) -> str:
    """``socket_id:channel``, plus ``:channel_data`` when given.

    Raises:
        InvalidSocketId: ``socket_id`` is not ``<digits>.<digits>``.
    """
    base = f"{check_socket_id(socket_id)}:{channel}"
    return base if channel_data is None else f"{base}:{channel_data}"


def sign_channel(secret: str, socket_id: str, channel: str, channel_data: str | None = None) -> str:
    """The hex signature authorizing ``socket_id`` to subscribe to ``channel``.

    Raises:
        InvalidSocketId: ``socket_id`` is not ``<digits>.<digits>``.
    """
    return sign(secret, channel_string_to_sign(socket_id, channel, channel_data))


def channel_auth(
    key: str, secret: str, socket_id: str, channel: str, channel_data: str | None = None
) -> str:
    """The ``auth`` value for a subscription: ``"<key>:<hex signature>"``.

    Raises:
        InvalidSocketId: ``socket_id`` is not ``<digits>.<digits>``.
    """
    return f"{key}:{sign_channel(secret, socket_id, channel, channel_data)}"


def verify_channel_auth(
    app_key: str,
    app_secret: str,
    auth: str | None,
    socket_id: str,
    channel: str,
    channel_data: str | None = None,
) -> bool:
    """Whether ``auth`` authorizes ``socket_id`` on ``channel`` for this app.

    The key part must be ``app_key`` and the signature must match, compared in
    constant time. A missing or malformed ``auth``, or a malformed ``socket_id``, is
    simply not valid.
    """
    if not is_valid_socket_id(socket_id):
        return False
    expected = sign_channel(app_secret, socket_id, channel, channel_data)
    return _check_auth(app_key, expected, auth)


def user_string_to_sign(socket_id: str, user_data: str) -> str:
    """``socket_id::user::user_data``.

    Raises:
        InvalidSocketId: ``socket_id`` is not ``<digits>.<digits>``.
    """
    return f"{check_socket_id(socket_id)}::user::{user_data}"


def sign_user(secret: str, socket_id: str, user_data: str) -> str:
    """The hex signature of a sign-in of ``socket_id`` as ``user_data``.

    Raises:
        InvalidSocketId: ``socket_id`` is not ``<digits>.<digits>``.
    """
    return sign(secret, user_string_to_sign(socket_id, user_data))


def user_auth(key: str, secret: str, socket_id: str, user_data: str) -> str:
    """The ``auth`` value for ``pusher:signin``: ``"<key>:<hex signature>"``.

    Raises:
        InvalidSocketId: ``socket_id`` is not ``<digits>.<digits>``.
    """
    return f"{key}:{sign_user(secret, socket_id, user_data)}"


def verify_user_auth(
    app_key: str, app_secret: str, auth: str | None, socket_id: str, user_data: str
) -> bool:
    """Whether ``auth`` signs ``socket_id`` in as ``user_data`` for this app
    (key checked, signature compared in constant time; a malformed ``socket_id`` is
    never signed in)."""
    if not is_valid_socket_id(socket_id):
        return False
    return _check_auth(app_key, sign_user(app_secret, socket_id, user_data), auth)


def purpose_key(secret: str, purpose: str) -> bytes:
    """The key of one of the project's own signatures:
    ``HMAC-SHA256(secret, "agent-broadcaster/<purpose>/v1")``, so that a signature made
    for one purpose is never valid for another, nor as a Pusher signature."""
    label = f"agent-broadcaster/{purpose}/v1".encode()
    return hmac.new(secret.encode(), label, hashlib.sha256).digest()


def purpose_signature(secret: str, purpose: str, text: str) -> str:
    """Hex HMAC-SHA256 of ``text`` under :func:`purpose_key` of ``purpose``."""
    return hmac.new(purpose_key(secret, purpose), text.encode(), hashlib.sha256).hexdigest()


def _xor_stream(key: bytes, tag: bytes, data: bytes) -> bytes:
    """``data`` XOR the key stream of ``tag``: HMAC-SHA256(key, tag || counter) blocks."""
    blocks = (
        hmac.new(key, tag + i.to_bytes(4, "big"), hashlib.sha256).digest()
        for i in range((len(data) + 31) // 32)
    )
    stream = b"".join(blocks)[: len(data)]
    return (int.from_bytes(data) ^ int.from_bytes(stream)).to_bytes(len(data))


def _seal_keys(secret: str, purpose: str) -> tuple[bytes, bytes]:
    key = purpose_key(secret, purpose)
    mac = hmac.new(key, b"mac", hashlib.sha256).digest()
    return mac, hmac.new(key, b"enc", hashlib.sha256).digest()


def seal(secret: str, purpose: str, data: bytes) -> str:
    """``data`` encrypted and authenticated under :func:`purpose_key` of ``purpose``, as
    URL-safe base64: what a client carries back without reading or changing it.

    Deterministic authenticated encryption in the SIV construction (RFC 5297's, with
    HMAC-SHA256 as its PRF): the tag is the HMAC of ``data`` (16 bytes, under one derived
    key) and the ciphertext ``data`` XOR HMAC-SHA256 blocks of the tag and a counter
    (under another). The same ``data`` seals to the same text, so an answer that holds
    one (the run list's, which has an ETag) stays the same while nothing changes. Built
    on :mod:`hmac`, as every other signature here, rather than on an AEAD library that
    would be a dependency for this one value."""
    mac, enc = _seal_keys(secret, purpose)
    tag = hmac.new(mac, data, hashlib.sha256).digest()[:_TAG]
    hidden = _xor_stream(enc, tag, data)
    return base64.urlsafe_b64encode(tag + hidden).decode().rstrip("=")


def unseal(secret: str, purpose: str, text: str) -> bytes:
    """The data :func:`seal` sealed into ``text`` under the same secret and purpose.

    Raises:
        ValueError: ``text`` is not one (changed, made up, or sealed under another key).
    """
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError) as exc:  # binascii.Error is a ValueError
        raise ValueError("not a sealed value") from exc
    if len(raw) < _TAG:
        raise ValueError("not a sealed value")
    mac, enc = _seal_keys(secret, purpose)
    tag, hidden = raw[:_TAG], raw[_TAG:]
    data = _xor_stream(enc, tag, hidden)
    if not hmac.compare_digest(hmac.new(mac, data, hashlib.sha256).digest()[:_TAG], tag):
        raise ValueError("not a sealed value")
    return data


def stream_auth(app_key: str, app_secret: str, channel: str) -> str:
    """The ``?auth=`` value that opens an HTTP stream (SSE, state) of private
    ``channel``: ``"<app_key>:<hex signature of the channel under the STREAM_AUTH
    key>"``."""
    return f"{app_key}:{purpose_signature(app_secret, STREAM_AUTH, channel)}"


def verify_stream_auth(app_key: str, app_secret: str, auth: str | None, channel: str) -> bool:
    """Whether ``auth`` is :func:`stream_auth` of ``channel`` for this app (key checked,
    signature compared in constant time)."""
    return _check_auth(app_key, purpose_signature(app_secret, STREAM_AUTH, channel), auth)


def _check_auth(app_key: str, expected: str, auth: str | None) -> bool:
    if not isinstance(auth, str):
        return False
    key, sep, signature = auth.partition(":")
    if not sep:
        return False
    key_ok = hmac.compare_digest(key.encode(), app_key.encode())
    signature_ok = hmac.compare_digest(signature.encode(), expected.encode())
    return key_ok and signature_ok


def body_md5(body: bytes) -> str:
    """Hex MD5 of a request body, as sent in ``body_md5``."""
    return hashlib.md5(body, usedforsecurity=False).hexdigest()


def request_string_to_sign(method: str, path: str, params: Mapping[str, str]) -> str:
    """``METHOD\\nPATH\\n`` and the params but ``auth_signature``, keys lowercased and
    sorted, as ``k=v`` joined by ``&`` (not URL-escaped)."""
    pairs = sorted((k.lower(), v) for k, v in params.items() if k.lower() != "auth_signature")
    query = "&".join(f"{k}={v}" for k, v in pairs)
    return f"{method.upper()}\n{path}\n{query}"


def sign_request(secret: str, method: str, path: str, params: Mapping[str, str]) -> str:
    """The hex ``auth_signature`` of an HTTP API request."""
    return sign(secret, request_string_to_sign(method, path, params))


def signed_params(
    key: str,
    secret: str,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    timestamp: int | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The query parameters of a signed HTTP API request, as the Pusher SDKs send
    them: ``auth_key``, ``auth_timestamp`` (now unless given), ``auth_version``,
    ``body_md5`` (for a non-empty body), ``extra`` and ``auth_signature``."""
    params = {
        "auth_key": key,
        "auth_timestamp": str(int(time.time()) if timestamp is None else timestamp),
        "auth_version": AUTH_VERSION,
        **(extra or {}),
    }
    if body:
        params["body_md5"] = body_md5(body)
    params["auth_signature"] = sign_request(secret, method, path, params)
    return params


class AppCredentials(Protocol):
    """What signing needs of an app: plain values (the server's ``AppConfig`` has them;
    this module does not import the server's settings)."""

    @property
    def id(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def secret(self) -> str: ...
    @property
    def enabled(self) -> bool: ...


def verify_request(
    app: AppCredentials,
    method: str,
    path: str,
    query: Mapping[str, str],
    body: bytes,
    now: float,
) -> None:
    """Check that an HTTP API request is signed by ``app``.

    Args:
        app: the app named by the ``{app_id}`` in the path.
        method: the HTTP method.
        path: the request path, without the query string.
        query: the decoded query parameters.
        body: the raw request body.
        now: the server's clock, in seconds since the epoch.

    Raises:
        ApiError: 403 if the app is disabled; 401 if an ``auth_*`` parameter is missing
            or wrong, the key is not the app's, the timestamp is more than 600 s away,
            ``body_md5`` is missing or wrong for a non-empty body, a query name is not
            lower-case ``[a-z0-9_]`` or a value holds ``&`` (either would let the
            signature sign another request too), or the signature does not match (the
            message shows the string that should have been signed).
    """
    if not app.enabled:
        raise ApiError(403, f"app {app.id!r} is disabled")
    missing = [name for name in _REQUIRED if not query.get(name)]
    if missing:
        raise ApiError(401, _missing_message(missing))
    if not hmac.compare_digest(query["auth_key"].encode(), app.key.encode()):
        raise ApiError(401, f"unknown auth_key {excerpt(query['auth_key'])} for app {app.id!r}")
    if query["auth_version"] != AUTH_VERSION:
        raise ApiError(
            401, f"unsupported auth_version {excerpt(query['auth_version'])}: use {AUTH_VERSION!r}"
        )
    _check_timestamp(query["auth_timestamp"], now)
    _check_body_md5(query.get("body_md5"), body)
    _check_unambiguous(query)
    _check_signature(app.secret, method, path, query)


# The query as the Pusher SDKs (and this project's publishers) send it: the signed
# parameters sorted by name, then the signature. Values without "%" or "+" (nothing to
# decode) nor "&" (nothing ambiguous).
_SDK_QUERY = re.compile(
    rb"auth_key=([^&%+]+)&auth_timestamp=([0-9]{1,"
    + str(MAX_TIMESTAMP_DIGITS).encode()
    + rb"})&auth_version=1\.0(?:&body_md5=([0-9a-f]{32}))?&auth_signature=([0-9a-f]{64})"
)
_SIGNATURE_PARAM = len(b"&auth_signature=")


def verify_sdk_query(
    app: AppCredentials, method: str, path: str, query: bytes, body: bytes, now: float
) -> bool:
    """Whether a request whose raw query string is ``query`` is signed by ``app``, for
    the query of the shape the SDKs send (``auth_key``, ``auth_timestamp``,
    ``auth_version``, ``body_md5`` when there is a body, in that order, then
    ``auth_signature``): the string to sign is then the query as sent, up to the
    signature, with no parsing or sorting.

    True only where :func:`verify_request` accepts the request too. False for any other
    query, and for any request that fails a check: :func:`verify_request` then decides
    (and says why it refuses). ``path`` is ASCII (the caller's route guarantees it).
    """
    if not app.enabled or not query.isascii():
        return False
    found = _SDK_QUERY.fullmatch(query)
    if found is None:
        return False
    key, timestamp, md5, signature = found.groups()
    if not hmac.compare_digest(key, app.key.encode()):
        return False
    if abs(int(timestamp) - int(now)) > MAX_TIMESTAMP_SKEW:
        return False
    if md5 is None:
        if body:
            return False
    elif not hmac.compare_digest(md5, body_md5(body).encode()):
        return False
    signed = b"\n".join(
        (method.upper().encode(), path.encode(), query[: found.start(4) - _SIGNATURE_PARAM])
    )
    keyed = _keyed(app.secret).copy()  # the key's setup done once per secret
    keyed.update(signed)
    return hmac.compare_digest(signature, keyed.hexdigest().encode())


class _Mac(Protocol):
    """What an HMAC in progress offers (``hmac.HMAC`` and OpenSSL's object alike)."""

    def copy(self) -> _Mac: ...

    def update(self, msg: bytes) -> None: ...

    def hexdigest(self) -> str: ...


@functools.lru_cache(maxsize=256)
def _keyed(secret: str) -> _Mac:
    """An HMAC-SHA256 keyed with ``secret``, to copy for each signature: OpenSSL's own
    object when ``hmac`` wraps one (its copy, update and digest without the Python
    wrapper's calls around them), else the ``hmac.HMAC``."""
    keyed = hmac.new(secret.encode(), digestmod=hashlib.sha256)
    inner: _Mac | None = getattr(keyed, "_hmac", None)
    return keyed if inner is None else inner


def _missing_message(missing: list[str]) -> str:
    names = ", ".join(missing)
    return (
        f"missing query parameter(s) {names}: signed requests need auth_key, "
        "auth_timestamp, auth_version=1.0, auth_signature and, with a body, body_md5"
    )


def _check_timestamp(value: str, now: float) -> None:
    if not (value.isascii() and value.isdigit()) or len(value) > MAX_TIMESTAMP_DIGITS:
        raise ApiError(
            401,
            f"auth_timestamp {excerpt(value)} is not whole seconds since the epoch "
            f"(at most {MAX_TIMESTAMP_DIGITS} digits; server time is {int(now)})",
        )
    skew = int(value) - int(now)
    if abs(skew) > MAX_TIMESTAMP_SKEW:
        direction = "ahead of" if skew > 0 else "behind"
        raise ApiError(
            401,
            f"auth_timestamp {value} is {abs(skew)} s {direction} server time {int(now)}; "
            f"allowed: within {MAX_TIMESTAMP_SKEW} s (check the client's clock)",
        )


def _check_body_md5(given: str | None, body: bytes) -> None:
    if not given:
        if body:
            raise ApiError(401, "missing body_md5: a request with a body must sign its MD5")
        return
    if not hmac.compare_digest(given.encode(), body_md5(body).encode()):
        raise ApiError(401, f"body_md5 {excerpt(given)} does not match the MD5 of the request body")


def _check_unambiguous(query: Mapping[str, str]) -> None:
    # One pass each over the names and the values: this runs on every publish.
    if not _SIGNED_NAMES.fullmatch("&".join(query)):
        name = next(n for n in query if not _SIGNED_NAMES.fullmatch(n))
        raise ApiError(
            401,
            f"query parameter name {excerpt(name)} is not lower-case letters, digits and _: "
            "the string to sign lower-cases names, so its signature would also sign "
            "another request",
        )
    if "&" in "".join(query.values()):
        name = next(n for n, v in query.items() if "&" in v)
        raise ApiError(
            401,
            f"query parameter {name} has '&' in its value: the string to sign joins "
            "parameters with an unescaped '&', so its signature would also sign the "
            "request with that value split in two",
        )


def _check_signature(secret: str, method: str, path: str, query: Mapping[str, str]) -> None:
    expected = sign_request(secret, method, path, query)
    if not hmac.compare_digest(query["auth_signature"].encode(), expected.encode()):
        text = request_string_to_sign(method, path, query)
        raise ApiError(
            401,
            f"invalid auth_signature: expected the hex HMAC-SHA256 of {excerpt(text, 256)} "
            "under the app secret",
        )
