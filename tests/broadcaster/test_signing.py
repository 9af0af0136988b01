"""Signatures: channel auth, user sign-in and signed HTTP API requests (Pusher vectors)."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from broadcaster.exceptions import ApiError
from broadcaster.settings import AppConfig
from broadcaster.signing import (
    body_md5,
    channel_auth,
    request_string_to_sign,
    sign_channel,
    sign_request,
    signed_params,
    user_auth,
    verify_channel_auth,
    verify_request,
    verify_user_auth,
)

KEY = "278d425bdf160c739803"
SECRET = "7ad3773142a6692b25b8"  # the protocol documentation's test secret
APP = AppConfig(id="3", key=KEY, secret=SECRET)
BODY = b'{"name":"foo","channels":["project-3"],"data":"{\\"some\\":\\"data\\"}"}'
TIMESTAMP = 1353088179
SIGNATURE = "da454824c97ba181a32ccc17a72625ba02771f50b50e1e7430e47a1f3f457e6c"


def signed_query(**overrides: str) -> dict[str, str]:
    query = {
        "auth_key": KEY,
        "auth_timestamp": str(TIMESTAMP),
        "auth_version": "1.0",
        "body_md5": "ec365a775a4cd0599faeb73354201b6f",
        "auth_signature": SIGNATURE,
    }
    query.update(overrides)
    return {k: v for k, v in query.items() if v != "<drop>"}


def api_error(query: dict[str, str], body: bytes = BODY, now: float = TIMESTAMP) -> ApiError:
    with pytest.raises(ApiError) as info:
        verify_request(APP, "POST", "/apps/3/events", query, body, now)
    return info.value


def test_private_channel_auth_matches_the_protocol_vector() -> None:
    expected = f"{KEY}:58df8b0c36d6982b82c3ecf6b4662e34fe8c25bba48f5369f135bf843651c3a4"
    assert channel_auth(KEY, SECRET, "1234.1234", "private-foobar") == expected
    assert verify_channel_auth(KEY, SECRET, expected, "1234.1234", "private-foobar")


def test_presence_signature_covers_channel_data() -> None:
    data = '{"user_id":"10","user_info":{"name":"Mr. Channels"}}'
    auth = channel_auth(KEY, SECRET, "1234.1234", "presence-foobar", data)
    assert verify_channel_auth(KEY, SECRET, auth, "1234.1234", "presence-foobar", data)
    assert not verify_channel_auth(KEY, SECRET, auth, "1234.1234", "presence-foobar", data + " ")
    assert not verify_channel_auth(KEY, SECRET, auth, "1234.1234", "presence-foobar")


@pytest.mark.parametrize(
    "auth",
    [
        None,
        "",
        "no-colon",
        f"{KEY}:",
        f"otherkey:{sign_channel(SECRET, '1234.1234', 'private-foobar')}",
        f"{KEY}:{sign_channel('other-secret', '1234.1234', 'private-foobar')}",
        f"{KEY}:{sign_channel(SECRET, '1234.1235', 'private-foobar')}",
        f"{KEY}:{sign_channel(SECRET, '1234.1234', 'private-foobaz')}",
        f"{KEY}:é",
    ],
)
def test_wrong_channel_auth_is_rejected(auth: str | None) -> None:
    assert not verify_channel_auth(KEY, SECRET, auth, "1234.1234", "private-foobar")


def test_user_signin_signs_socket_user_and_data() -> None:
    user_data = '{"id":"42","user_info":{"name":"Ada"}}'
    auth = user_auth(KEY, SECRET, "1.2", user_data)
    assert verify_user_auth(KEY, SECRET, auth, "1.2", user_data)
    text = b'1.2::user::{"id":"42","user_info":{"name":"Ada"}}'
    assert auth == f"{KEY}:{hmac.new(SECRET.encode(), text, hashlib.sha256).hexdigest()}"
    assert not verify_user_auth(KEY, SECRET, auth, "1.3", user_data)
    assert not verify_user_auth(KEY, SECRET, auth, "1.2", user_data.replace("42", "43"))
    assert not verify_user_auth("other", SECRET, auth, "1.2", user_data)


def test_http_vector_body_md5_and_signature() -> None:
    assert body_md5(BODY) == "ec365a775a4cd0599faeb73354201b6f"
    params = signed_query(auth_signature="<drop>")
    assert sign_request(SECRET, "POST", "/apps/3/events", params) == SIGNATURE


def test_string_to_sign_lowercases_sorts_and_skips_the_signature() -> None:
    text = request_string_to_sign(
        "get", "/apps/3/channels", {"b": "2", "A": "x y", "auth_signature": "s"}
    )
    assert text == "GET\n/apps/3/channels\na=x y&b=2"


def test_the_worked_vector_request_verifies() -> None:
    verify_request(APP, "POST", "/apps/3/events", signed_query(), BODY, TIMESTAMP + 599)


def test_a_get_without_body_needs_no_body_md5() -> None:
    query = signed_query(body_md5="<drop>", filter_by_prefix="presence-")
    query["auth_signature"] = sign_request(SECRET, "GET", "/apps/3/channels", query)
    verify_request(APP, "GET", "/apps/3/channels", query, b"", TIMESTAMP)


@pytest.mark.parametrize(
    ("query", "fragment"),
    [
        (signed_query(auth_key="<drop>"), "missing query parameter(s) auth_key"),
        (
            signed_query(auth_signature="<drop>", auth_version="<drop>"),
            "auth_version, auth_signature",
        ),
        (signed_query(auth_key="nope"), "unknown auth_key 'nope' for app '3'"),
        (signed_query(auth_version="2.0"), "unsupported auth_version '2.0': use '1.0'"),
        (signed_query(auth_timestamp="soon"), "auth_timestamp 'soon' is not whole seconds"),
        (signed_query(auth_timestamp="\uff11\uff12"), "is not whole seconds"),
        (signed_query(body_md5="<drop>"), "missing body_md5"),
        (signed_query(body_md5="0" * 32), "does not match the MD5"),
        (signed_query(auth_signature="0" * 64), "invalid auth_signature: expected the hex"),
    ],
)
def test_bad_requests_get_401_saying_what_is_wrong(query: dict[str, str], fragment: str) -> None:
    error = api_error(query)
    assert error.status == 401
    assert fragment in error.message


def test_the_signature_error_shows_the_string_to_sign() -> None:
    error = api_error(signed_query(auth_signature="0" * 64))
    assert "'POST\\n/apps/3/events\\nauth_key=" in error.message


def test_a_tampered_body_fails_the_md5_check() -> None:
    assert "does not match" in api_error(signed_query(), body=BODY + b" ").message


def test_timestamp_outside_600_seconds_says_the_skew() -> None:
    late = api_error(signed_query(), now=TIMESTAMP + 601)
    assert late.status == 401
    assert "601 s behind server time" in late.message
    early = api_error(signed_query(), now=TIMESTAMP - 1000)
    assert "1000 s ahead of server time" in early.message


def test_a_disabled_app_is_forbidden() -> None:
    app = AppConfig(id="3", key=KEY, secret=SECRET, enabled=False)
    with pytest.raises(ApiError) as info:
        verify_request(app, "POST", "/apps/3/events", signed_query(), BODY, TIMESTAMP)
    assert info.value.status == 403
    assert "disabled" in info.value.message


def test_signed_params_reproduce_the_protocol_vector() -> None:
    params = signed_params(KEY, SECRET, "POST", "/apps/3/events", BODY, timestamp=TIMESTAMP)
    assert params == signed_query()
    verify_request(APP, "POST", "/apps/3/events", params, BODY, TIMESTAMP)


def test_signed_params_leave_out_body_md5_for_an_empty_body() -> None:
    params = signed_params(KEY, SECRET, "GET", "/apps/3/channels", timestamp=TIMESTAMP)
    assert "body_md5" not in params
    verify_request(APP, "GET", "/apps/3/channels", params, b"", TIMESTAMP)
