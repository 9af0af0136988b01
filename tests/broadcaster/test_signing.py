"""Signatures: channel auth, user sign-in and signed HTTP API requests (Pusher vectors),
strict socket ids (no signing oracle) and the project's per-purpose keys."""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import parse_qsl

import pytest

from broadcaster.exceptions import ApiError
from broadcaster.sessions import session_token
from broadcaster.settings import AppConfig
from broadcaster.signing import (
    MAX_SOCKET_ID_LENGTH,
    SESSION_TOKEN,
    STREAM_AUTH,
    InvalidSocketId,
    body_md5,
    channel_auth,
    channel_string_to_sign,
    check_socket_id,
    is_valid_socket_id,
    purpose_key,
    purpose_signature,
    request_string_to_sign,
    sign,
    sign_channel,
    sign_request,
    sign_user,
    signed_params,
    stream_auth,
    user_auth,
    user_string_to_sign,
    verify_channel_auth,
    verify_request,
    verify_sdk_query,
    verify_stream_auth,
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


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        # Both sign as "info=user_count": a replayer could change a captured request.
        ({"INFO": "user_count"}, "query parameter name 'INFO' is not lower-case"),
        ({"filter_by_prefix": "presence-&info=user_count"}, "filter_by_prefix has '&'"),
        ({"": "x"}, "query parameter name '' is not lower-case"),
        ({"info=user_count&x": "1"}, "is not lower-case letters, digits and _"),
    ],
)
def test_a_query_that_would_sign_as_another_request_is_refused(
    extra: dict[str, str], fragment: str
) -> None:
    """Validly signed under the Pusher scheme, and still refused: the string to sign
    lower-cases names and joins pairs with an unescaped "&", so the same signature
    covers a different request (upper-case "INFO", or "&" folded into a value)."""
    query = signed_query(body_md5="<drop>", **extra)
    query["auth_signature"] = sign_request(SECRET, "GET", "/apps/3/channels", query)
    with pytest.raises(ApiError) as info:
        verify_request(APP, "GET", "/apps/3/channels", query, b"", TIMESTAMP)
    assert info.value.status == 401
    assert fragment in info.value.message
    assert "would also sign" in info.value.message


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


def test_a_timestamp_of_5000_digits_gets_401_with_an_excerpt() -> None:
    """int() refuses more than 4300 digits: this used to be a 500."""
    error = api_error(signed_query(auth_timestamp="9" * 5000))
    assert error.status == 401
    assert "is not whole seconds since the epoch (at most 20 digits" in error.message
    assert "(5000 characters)" in error.message
    assert len(error.message) < 300


def test_a_21_digit_timestamp_is_refused_unread_and_a_20_digit_one_is_a_skew() -> None:
    assert "at most 20 digits" in api_error(signed_query(auth_timestamp="1" * 21)).message
    assert "s ahead of server time" in api_error(signed_query(auth_timestamp="1" * 20)).message


def test_error_messages_show_only_an_excerpt_of_long_parameters() -> None:
    for name in ("auth_key", "auth_version", "body_md5"):
        error = api_error(signed_query(**{name: "x" * 100_000}))
        assert error.status == 401
        assert "(100000 characters)" in error.message, name
        assert len(error.message) < 300, name
    long_query = signed_query(auth_signature="0" * 64, zzz="y" * 100_000)
    assert len(api_error(long_query).message) < 500


# -- socket ids: nothing is signed for text that is not <digits>.<digits> ----------------

MALFORMED_SOCKET_IDS = [
    "",
    "1",
    "1.",
    ".1",
    "1.2.3",
    "a.b",
    "1.2\n",
    " 1.2",
    "1.2:private-agent.victim",
    "POST\n/apps/1/events\nauth_key=k&zzz=x",
    "\u0661.\u0662",  # Arabic-Indic digits match \d, not a socket id
    "\uff11.\uff12",  # full-width digits
    "1" * 32 + "." + "1" * 32,  # 65 characters
]


@pytest.mark.parametrize("socket_id", ["1.2", "1234.1234", "9" * 31 + "." + "9" * 32])
def test_socket_ids_are_ascii_digits_dot_digits(socket_id: str) -> None:
    assert is_valid_socket_id(socket_id)
    assert check_socket_id(socket_id) == socket_id


@pytest.mark.parametrize("socket_id", MALFORMED_SOCKET_IDS)
def test_nothing_is_signed_for_a_malformed_socket_id(socket_id: str) -> None:
    assert not is_valid_socket_id(socket_id)
    for make in (
        lambda: channel_string_to_sign(socket_id, "private-a"),
        lambda: sign_channel(SECRET, socket_id, "private-a"),
        lambda: channel_auth(KEY, SECRET, socket_id, "presence-a", '{"user_id":"1"}'),
        lambda: user_string_to_sign(socket_id, '{"id":"1"}'),
        lambda: sign_user(SECRET, socket_id, '{"id":"1"}'),
        lambda: user_auth(KEY, SECRET, socket_id, '{"id":"1"}'),
    ):
        with pytest.raises(InvalidSocketId, match=r"is <digits>\.<digits>"):
            make()


@pytest.mark.parametrize("socket_id", MALFORMED_SOCKET_IDS)
def test_nothing_signed_for_a_malformed_socket_id_verifies(socket_id: str) -> None:
    """Even a correct HMAC of the text (made by someone else) does not pass."""
    channel_text = f"{socket_id}:private-a"
    user_text = f"{socket_id}::user::{{}}"
    assert not verify_channel_auth(
        KEY, SECRET, f"{KEY}:{sign(SECRET, channel_text)}", socket_id, "private-a"
    )
    assert not verify_user_auth(KEY, SECRET, f"{KEY}:{sign(SECRET, user_text)}", socket_id, "{}")


def test_the_socket_id_error_shows_an_excerpt_and_what_a_socket_id_is() -> None:
    with pytest.raises(InvalidSocketId) as info:
        check_socket_id("x" * 5000)
    message = str(info.value)
    assert "(5000 characters)" in message
    assert f"at most {MAX_SOCKET_ID_LENGTH} characters" in message
    assert len(message) < 300
    assert isinstance(info.value, ValueError)


# -- the project's own signatures: one key per purpose ------------------------------------


def test_purpose_keys_are_derived_from_the_secret_and_the_purpose() -> None:
    label = f"agent-broadcaster/{SESSION_TOKEN}/v1".encode()
    assert purpose_key(SECRET, SESSION_TOKEN) == hmac.digest(SECRET.encode(), label, "sha256")
    assert purpose_key(SECRET, SESSION_TOKEN) != purpose_key(SECRET, STREAM_AUTH)
    assert purpose_key(SECRET, STREAM_AUTH) != purpose_key("other", STREAM_AUTH)


def test_a_signature_serves_one_purpose_only() -> None:
    text = "1234.1234:private-agent.s1"
    pusher = sign(SECRET, text)
    session = purpose_signature(SECRET, SESSION_TOKEN, text)
    stream = purpose_signature(SECRET, STREAM_AUTH, text)
    assert len({pusher, session, stream}) == 3


def test_stream_auth_verifies_for_its_channel_and_app_only() -> None:
    auth = stream_auth(KEY, SECRET, "private-agent.s1")
    assert auth == f"{KEY}:{purpose_signature(SECRET, STREAM_AUTH, 'private-agent.s1')}"
    assert verify_stream_auth(KEY, SECRET, auth, "private-agent.s1")
    assert not verify_stream_auth(KEY, SECRET, auth, "private-agent.s2")
    assert not verify_stream_auth("other", SECRET, auth, "private-agent.s1")
    assert not verify_stream_auth(KEY, "other", auth, "private-agent.s1")
    assert not verify_stream_auth(KEY, SECRET, None, "private-agent.s1")


def test_a_pusher_channel_signature_is_not_a_stream_auth() -> None:
    """The old stream auth was a channel signature for socket id "sse"."""
    old = f"{KEY}:{sign(SECRET, 'sse:private-agent.s1')}"
    assert not verify_stream_auth(KEY, SECRET, old, "private-agent.s1")


def test_a_session_token_is_signed_under_its_own_key() -> None:
    token = session_token(APP, "s1", "nonce")
    assert token == purpose_signature(SECRET, SESSION_TOKEN, "s1\nnonce")
    assert token != session_token(APP, "s1", "another claim")
    assert token != sign(SECRET, "demo-session:s1")  # the old token: a raw-secret HMAC


# -- the SDK-shaped query, checked from its bytes ------------------------------------------


def raw_query(query: dict[str, str]) -> bytes:
    return "&".join(f"{k}={v}" for k, v in query.items()).encode()


def test_the_worked_vector_verifies_from_its_raw_query() -> None:
    assert verify_sdk_query(
        APP, "POST", "/apps/3/events", raw_query(signed_query()), BODY, TIMESTAMP
    )


def _variants() -> list[tuple[bytes, bytes, float, AppConfig, bool]]:
    """Valid, invalid and differently shaped requests around the worked vector, each
    with whether its query has the SDKs' shape."""
    good = signed_query()
    disabled = AppConfig(id="3", key=KEY, secret=SECRET, enabled=False)
    other_secret = AppConfig(id="3", key=KEY, secret="another")
    reordered = {k: good[k] for k in ("auth_timestamp", "auth_key", "auth_version", "body_md5")}
    sdk = raw_query(good)
    cases: list[tuple[bytes, bytes, float, AppConfig, bool]] = [
        (sdk, BODY, TIMESTAMP, APP, True),
        (sdk, BODY, TIMESTAMP + 600, APP, True),
        (sdk, BODY, TIMESTAMP - 601, APP, True),
        (sdk, BODY + b" ", TIMESTAMP, APP, True),
        (sdk, b"", TIMESTAMP, APP, True),
        (sdk, BODY, TIMESTAMP, disabled, True),
        (sdk, BODY, TIMESTAMP, other_secret, True),
        (raw_query(signed_query(auth_key="other")), BODY, TIMESTAMP, APP, True),
        (raw_query(signed_query(auth_signature="0" * 64)), BODY, TIMESTAMP, APP, True),
        (raw_query({**reordered, "auth_signature": SIGNATURE}), BODY, TIMESTAMP, APP, False),
        (sdk + b"&info=user_count", BODY, TIMESTAMP, APP, False),
        (sdk.replace(b"auth_key", b"AUTH_KEY"), BODY, TIMESTAMP, APP, False),
        (sdk.upper(), BODY, TIMESTAMP, APP, False),
        (raw_query(signed_query(auth_key="278d%34")), BODY, TIMESTAMP, APP, False),
        (raw_query(signed_query(auth_version="1.1")), BODY, TIMESTAMP, APP, False),
        (raw_query(signed_query(auth_timestamp="0" * 21)), BODY, TIMESTAMP, APP, False),
        (raw_query(signed_query(body_md5="<drop>")), BODY, TIMESTAMP, APP, True),
        (raw_query(signed_query(auth_signature=SIGNATURE.upper())), BODY, TIMESTAMP, APP, False),
        (sdk + b"&auth_signature=" + b"0" * 64, BODY, TIMESTAMP, APP, False),
        (sdk + b"&", BODY, TIMESTAMP, APP, False),
        (sdk.replace(b"278d", "27\u00e9".encode()), BODY, TIMESTAMP, APP, False),
    ]
    # Signed without a body: no body_md5.
    params = signed_params(KEY, SECRET, "POST", "/apps/3/events", timestamp=TIMESTAMP)
    cases.append((raw_query(params), b"", TIMESTAMP, APP, True))
    cases.append((raw_query(params), BODY, TIMESTAMP, APP, True))
    return cases


@pytest.mark.parametrize(("query", "body", "now", "app", "sdk_shaped"), _variants())
def test_the_raw_query_check_accepts_exactly_the_valid_sdk_shaped_requests(
    query: bytes, body: bytes, now: float, app: AppConfig, sdk_shaped: bool
) -> None:
    # What the HTTP API does otherwise: the query decoded as Starlette decodes it.
    parsed = dict(parse_qsl(query.decode("latin-1"), keep_blank_values=True))
    try:
        verify_request(app, "POST", "/apps/3/events", parsed, body, now)
        valid = True
    except ApiError:
        valid = False
    fast = verify_sdk_query(app, "POST", "/apps/3/events", query, body, now)
    assert fast == (valid and sdk_shaped)


# -- sealed values (the run list's cursors) ---------------------------------------------


@pytest.mark.parametrize(
    "data", [b"", b"x", b'[1795887598434,"private-agent.s\\nx-1"]', bytes(300)]
)
def test_a_sealed_value_opens_with_its_key_and_purpose_only(data: bytes) -> None:
    from broadcaster.signing import LIST_CURSOR, seal, unseal

    text = seal("secret", LIST_CURSOR, data)
    assert unseal("secret", LIST_CURSOR, text) == data
    assert seal("secret", LIST_CURSOR, data) == text, "deterministic: an ETag stays"
    for secret, purpose in (("other", LIST_CURSOR), ("secret", STREAM_AUTH)):
        with pytest.raises(ValueError, match="not a sealed value"):
            unseal(secret, purpose, text)


def test_a_sealed_value_hides_its_data_and_refuses_any_change() -> None:
    import base64

    from broadcaster.signing import LIST_CURSOR, seal, unseal

    data = b'[1795887598434,"private-agent.s-secret\\nx-1"]'
    text = seal("secret", LIST_CURSOR, data)
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    assert b"private" not in raw
    assert b"secret" not in raw
    for i in range(len(raw)):  # every single bit flipped anywhere is refused
        for bit in (1, 128):
            changed = bytearray(raw)
            changed[i] ^= bit
            forged = base64.urlsafe_b64encode(bytes(changed)).decode().rstrip("=")
            with pytest.raises(ValueError, match="not a sealed value"):
                unseal("secret", LIST_CURSOR, forged)
    for junk in ("", "A", "%%%", "AAAA" * 3):
        with pytest.raises(ValueError, match="not a sealed value"):
            unseal("secret", LIST_CURSOR, junk)
