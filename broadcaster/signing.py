"""Pusher signatures: channel authorization, user sign-in and signed HTTP API requests.

Every signature is the hex HMAC-SHA256 of a string under the app secret, and every
comparison is constant-time (:func:`hmac.compare_digest`).

- Private channel: ``socket_id:channel``; presence channel (or any channel subscribed
  with ``channel_data``): ``socket_id:channel:channel_data``. The client sends
  ``auth = "<app_key>:<hex signature>"``.
- User sign-in: ``socket_id::user::user_data``, ``auth`` in the same form.
- HTTP API: ``METHOD\\nPATH\\n`` followed by every query parameter but ``auth_signature``,
  keys lowercased, sorted by key, joined as ``k=v`` with ``&`` and not URL-escaped; the
  signature is sent as ``auth_signature``, next to ``auth_key``, ``auth_timestamp``,
  ``auth_version=1.0`` and, for a non-empty body, ``body_md5``.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

from broadcaster.exceptions import ApiError
from broadcaster.settings import AppConfig

__all__ = [
    "AUTH_VERSION",
    "MAX_TIMESTAMP_SKEW",
    "body_md5",
    "channel_auth",
    "channel_string_to_sign",
    "request_string_to_sign",
    "sign",
    "sign_channel",
    "sign_request",
    "sign_user",
    "signed_params",
    "user_auth",
    "user_string_to_sign",
    "verify_channel_auth",
    "verify_request",
    "verify_user_auth",
]

AUTH_VERSION = "1.0"
MAX_TIMESTAMP_SKEW = 600
"""Seconds an ``auth_timestamp`` may differ from the server's clock, either way."""

_REQUIRED = ("auth_key", "auth_timestamp", "auth_version", "auth_signature")


def sign(secret: str, text: str) -> str:
    """Hex HMAC-SHA256 of ``text`` under ``secret``."""
    return hmac.new(secret.encode(), text.encode(), hashlib.sha256).hexdigest()


def channel_string_to_sign(socket_id: str, channel: str, channel_data: str | None = None) -> str:
    """``socket_id:channel``, plus ``:channel_data`` when given."""
    base = f"{socket_id}:{channel}"
    return base if channel_data is None else f"{base}:{channel_data}"


def sign_channel(secret: str, socket_id: str, channel: str, channel_data: str | None = None) -> str:
    """The hex signature authorizing ``socket_id`` to subscribe to ``channel``."""
    return sign(secret, channel_string_to_sign(socket_id, channel, channel_data))


def channel_auth(
    key: str, secret: str, socket_id: str, channel: str, channel_data: str | None = None
) -> str:
    """The ``auth`` value for a subscription: ``"<key>:<hex signature>"``."""
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
    constant time. A missing or malformed ``auth`` is simply not valid.
    """
    expected = sign_channel(app_secret, socket_id, channel, channel_data)
    return _check_auth(app_key, expected, auth)


def user_string_to_sign(socket_id: str, user_data: str) -> str:
    """``socket_id::user::user_data``."""
    return f"{socket_id}::user::{user_data}"


def sign_user(secret: str, socket_id: str, user_data: str) -> str:
    """The hex signature of a sign-in of ``socket_id`` as ``user_data``."""
    return sign(secret, user_string_to_sign(socket_id, user_data))


def user_auth(key: str, secret: str, socket_id: str, user_data: str) -> str:
    """The ``auth`` value for ``pusher:signin``: ``"<key>:<hex signature>"``."""
    return f"{key}:{sign_user(secret, socket_id, user_data)}"


def verify_user_auth(
    app_key: str, app_secret: str, auth: str | None, socket_id: str, user_data: str
) -> bool:
    """Whether ``auth`` signs ``socket_id`` in as ``user_data`` for this app
    (key checked, signature compared in constant time)."""
    return _check_auth(app_key, sign_user(app_secret, socket_id, user_data), auth)


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


def verify_request(
    app: AppConfig,
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
            ``body_md5`` is missing or wrong for a non-empty body, or the signature does
            not match (the message shows the string that should have been signed).
    """
    if not app.enabled:
        raise ApiError(403, f"app {app.id!r} is disabled")
    missing = [name for name in _REQUIRED if not query.get(name)]
    if missing:
        raise ApiError(401, _missing_message(missing))
    if not hmac.compare_digest(query["auth_key"].encode(), app.key.encode()):
        raise ApiError(401, f"unknown auth_key {query['auth_key']!r} for app {app.id!r}")
    if query["auth_version"] != AUTH_VERSION:
        raise ApiError(
            401, f"unsupported auth_version {query['auth_version']!r}: use {AUTH_VERSION!r}"
        )
    _check_timestamp(query["auth_timestamp"], now)
    _check_body_md5(query.get("body_md5"), body)
    _check_signature(app.secret, method, path, query)


def _missing_message(missing: list[str]) -> str:
    names = ", ".join(missing)
    return (
        f"missing query parameter(s) {names}: signed requests need auth_key, "
        "auth_timestamp, auth_version=1.0, auth_signature and, with a body, body_md5"
    )


def _check_timestamp(value: str, now: float) -> None:
    if not (value.isascii() and value.isdigit()):
        raise ApiError(401, f"auth_timestamp {value!r} is not whole seconds since the epoch")
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
        raise ApiError(401, f"body_md5 {given!r} does not match the MD5 of the request body")


def _check_signature(secret: str, method: str, path: str, query: Mapping[str, str]) -> None:
    expected = sign_request(secret, method, path, query)
    if not hmac.compare_digest(query["auth_signature"].encode(), expected.encode()):
        text = request_string_to_sign(method, path, query)
        raise ApiError(
            401,
            f"invalid auth_signature: expected the hex HMAC-SHA256 of {text!r} "
            "under the app secret",
        )
