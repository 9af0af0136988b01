"""Who the client is behind trusted proxies (issue 29, point 4): the rightmost hop that
is not a trusted proxy, from X-Forwarded-For or Forwarded, only on a connection from a
trusted proxy. End to end through nginx: tests/e2e/server/test_nginx.py."""

from __future__ import annotations

import pytest

from broadcaster.proxies import TrustedProxies, parse_networks
from broadcaster.settings import SettingsError, load_settings

PROXIES = TrustedProxies(["10.0.0.0/8", "127.0.0.1", "2001:db8::/32"])


def xff(*values: str) -> list[tuple[bytes, bytes]]:
    return [(b"x-forwarded-for", value.encode()) for value in values]


def forwarded(*values: str) -> list[tuple[bytes, bytes]]:
    return [(b"forwarded", value.encode()) for value in values]


@pytest.mark.parametrize(
    ("peer", "headers", "client"),
    [
        # An untrusted peer's headers are ignored: it is the client.
        ("203.0.113.9", xff("198.51.100.1"), "203.0.113.9"),
        ("203.0.113.9", forwarded("for=198.51.100.1"), "203.0.113.9"),
        # A trusted proxy names the client it served.
        ("127.0.0.1", xff("198.51.100.1"), "198.51.100.1"),
        ("127.0.0.1", xff("198.51.100.1:4711"), "198.51.100.1"),
        ("127.0.0.1", xff("[2001:db9::1]:4711"), "2001:db9::1"),
        ("127.0.0.1", forwarded('for="[2001:db9::1]:4711";proto=https'), "2001:db9::1"),
        ("::ffff:127.0.0.1", xff("198.51.100.1"), "198.51.100.1"),
        # Left of the rightmost untrusted hop is what that client made up.
        ("127.0.0.1", xff("1.1.1.1, 198.51.100.1"), "198.51.100.1"),
        ("127.0.0.1", xff("1.1.1.1", "198.51.100.1, 10.0.0.7"), "198.51.100.1"),
        ("127.0.0.1", forwarded("for=1.1.1.1, for=198.51.100.1;by=10.0.0.7"), "198.51.100.1"),
        # Trusted proxies all the way: the leftmost one.
        ("127.0.0.1", xff("10.0.0.8, 10.0.0.7"), "10.0.0.8"),
        # No header: the proxy itself.
        ("127.0.0.1", [], "127.0.0.1"),
        # Not an address: stop at the last trusted hop.
        ("127.0.0.1", xff("198.51.100.1, unknown"), "127.0.0.1"),
        ("127.0.0.1", forwarded("for=_hidden"), "127.0.0.1"),
        ("127.0.0.1", xff("198.51.100.1, garbage, 10.0.0.7"), "10.0.0.7"),
        # X-Forwarded-For, when present, wins over Forwarded.
        ("127.0.0.1", [*forwarded("for=9.9.9.9"), *xff("198.51.100.1")], "198.51.100.1"),
    ],
)
def test_the_client_is_the_rightmost_untrusted_hop(
    peer: str, headers: list[tuple[bytes, bytes]], client: str
) -> None:
    assert PROXIES.client(peer, headers) == client


def test_no_trusted_proxy_trusts_nothing() -> None:
    none = TrustedProxies()
    assert not none
    assert none.client("127.0.0.1", xff("198.51.100.1")) == "127.0.0.1"


def test_networks_are_addresses_or_cidrs_and_the_setting_names_a_bad_one() -> None:
    assert [str(n) for n in parse_networks(["10.0.0.0/8, ::1", " "])] == ["10.0.0.0/8", "::1/128"]
    settings = load_settings(trusted_proxies="127.0.0.1,10.1.0.0/16")
    assert settings.trusted_proxies == ("127.0.0.1/32", "10.1.0.0/16")
    with pytest.raises(SettingsError, match=r"trusted_proxies='10\.0\.0\.0/99'.*not an IP address"):
        load_settings(trusted_proxies="10.0.0.0/99")


def test_the_environment_takes_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BROADCASTER_TRUSTED_PROXIES", "192.168.0.0/16,127.0.0.1")
    assert load_settings().trusted_proxies == ("192.168.0.0/16", "127.0.0.1/32")
