"""Allowed origins, parsed as scheme, host and port (issue 44): ``*.partner.example``
admitted ``http://`` and any port, and was matched against the whole Origin string, so
``https://evil.com/.partner.example`` was admitted."""

from __future__ import annotations

from pathlib import Path

import pytest

from broadcaster.origins import ANY_PORT, OriginPattern, origin_allowed, parse_origin_pattern
from broadcaster.settings import AppConfig, SettingsError, load_settings
from tests.support.live import write_apps

PARTNER = ["*.partner.example"]


@pytest.mark.parametrize(
    "origin",
    [
        "https://a.partner.example",
        "https://a.b.partner.example",
        "HTTPS://A.Partner.Example",
        "https://a.partner.example:443",
    ],
)
def test_a_subdomain_pattern_admits_https_names_under_its_domain(origin: str) -> None:
    assert origin_allowed(origin, PARTNER)


@pytest.mark.parametrize(
    "origin",
    [
        "https://evil.com/.partner.example",  # a path: not an origin at all
        "https://evil.com?.partner.example",
        "https://evil.com#.partner.example",
        "https://a.partner.example@evil.com",
        "http://a.partner.example",  # https only, unless the pattern says http
        "https://a.partner.example:8443",  # the default port only
        "https://partner.example",  # the domain itself is not under it
        "https://evilpartner.example",
        "https://a.partner.example.evil.com",
        "wss://a.partner.example",
        "null",
        "a.partner.example",
        "",
    ],
)
def test_a_subdomain_pattern_refuses_look_alikes(origin: str) -> None:
    assert not origin_allowed(origin, PARTNER)
    assert not origin_allowed(None, PARTNER)


@pytest.mark.parametrize(
    ("pattern", "admitted", "refused"),
    [
        ("https://app.example", "https://app.example", "https://app.example:444"),
        ("app.example", "https://app.example:443", "http://app.example"),
        ("http://localhost:3000", "http://localhost:3000", "http://localhost:3001"),
        ("http://localhost:*", "http://localhost:5173", "https://localhost:5173"),
        ("https://*.example.com:8443", "https://x.example.com:8443", "https://x.example.com"),
        ("http://[::1]:8080", "http://[::1]:8080", "http://[::2]:8080"),
        ("http://127.0.0.1:9000", "http://127.0.0.1:9000", "http://127.0.0.10:9000"),
    ],
)
def test_scheme_host_and_port_must_all_match(pattern: str, admitted: str, refused: str) -> None:
    assert origin_allowed(admitted, [pattern])
    assert not origin_allowed(refused, [pattern])


def test_star_admits_any_origin_also_none() -> None:
    assert origin_allowed(None, ["https://a.example", "*"])
    assert origin_allowed("https://evil.com/.x", ["*"])


def test_patterns_parse_into_their_parts() -> None:
    assert parse_origin_pattern("*.Partner.Example") == OriginPattern(
        "https", "partner.example", 443, subdomains=True
    )
    assert parse_origin_pattern("http://localhost:*").port == ANY_PORT


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        ("https://a.example/path", "no path"),
        ("a*.example", "first label"),
        ("*.*.example", "first label"),
        ("user@a.example", "no path"),
        ("https://a.example:99999", "1-65535"),
        ("https://a.example:0", "1-65535"),
        ("1http://a.example", "not a scheme"),
        ("https://a_!.example", "not a host name"),
        ("https://", "no host"),
    ],
)
def test_a_malformed_pattern_is_refused_saying_why(pattern: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_origin_pattern(pattern)
    assert not origin_allowed("https://a.example", [pattern])


def test_the_settings_refuse_a_malformed_pattern_at_start_up(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="first label"):
        AppConfig(id="1", key="k", secret="s", allowed_origins=("a*.example",))
    app = AppConfig(id="1", key="k", secret="s", allowed_origins=("*", "*.a.example"))
    assert app.allowed_origins == ("*", "*.a.example")
    bad = {"id": "1", "key": "k", "secret": "s", "allowed_origins": ["https://a.example/x"]}
    with pytest.raises(SettingsError, match="no path"):
        load_settings(apps_file=write_apps(tmp_path / "apps.json", bad)).apps()
