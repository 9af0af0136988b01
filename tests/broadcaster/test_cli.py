"""The command line: its help tells the defaults the code uses; what it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from broadcaster.backends import describe_backend
from broadcaster.backends.base import DEFAULT_REDIS_PREFIX
from broadcaster.cli import main
from broadcaster.settings import load_settings


def test_serve_help_names_the_redis_prefix_the_settings_default_to() -> None:
    result = CliRunner().invoke(main, ["serve", "--help"])
    assert result.exit_code == 0, result.output
    help_text = " ".join(result.output.split())
    assert f"Prefix of every Redis key [{DEFAULT_REDIS_PREFIX}]" in help_text
    assert load_settings().redis_prefix == DEFAULT_REDIS_PREFIX == "agentbc"


def test_serve_takes_trusted_proxies_also_by_uvicorns_option_name() -> None:
    """``--trusted-proxies`` (and ``--forwarded-allow-ips``, the name uvicorn users know)
    reach the settings: a bad value stops start-up naming it."""
    for option in ("--trusted-proxies", "--forwarded-allow-ips"):
        result = CliRunner().invoke(main, ["serve", option, "127.0.0.1,not-an-ip"])
        assert result.exit_code == 1, result.output
        assert "invalid setting trusted_proxies" in result.output
        assert "'not-an-ip' is not an IP address or CIDR network" in result.output


def test_the_banner_names_each_backend_without_credentials() -> None:
    assert describe_backend("memory://").startswith("memory (this process only")
    for url, shown in [
        ("redis://:pw@h:6379/0?password=pw", "redis redis://h:6379/0"),
        ("rediss://u:pw@h:6380/1", "redis (TLS) rediss://h:6380/1"),
        (
            "redis-sentinel://:pw@s1:26379,s2:26379/mymaster/0",
            "sentinel redis-sentinel://s1:26379,s2:26379/mymaster/0",
        ),
        (
            "rediss-cluster://u:pw@c1:7000,c2:7001/",
            "cluster (TLS) rediss-cluster://c1:7000,c2:7001/",
        ),
    ]:
        assert describe_backend(url) == shown


def test_allowed_origins_come_from_the_option_or_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """For the single app; with an apps file they are set per app in it, so giving them
    as well is refused, naming both."""
    assert load_settings().apps()[0].allowed_origins == ("*",)
    given = load_settings(allowed_origins="https://a.example, *.b.example")
    assert given.apps()[0].allowed_origins == ("https://a.example", "*.b.example")
    monkeypatch.setenv("BROADCASTER_ALLOWED_ORIGINS", "https://env.example")
    assert load_settings().apps()[0].allowed_origins == ("https://env.example",)
    apps = tmp_path / "apps.json"
    apps.write_text('[{"id": "1", "key": "k", "secret": "s"}]')
    result = CliRunner().invoke(main, ["serve", "--apps-file", str(apps)])
    assert result.exit_code == 1, result.output
    assert "with an apps file" in result.output
    assert "set allowed_origins per app in it" in result.output
    monkeypatch.delenv("BROADCASTER_ALLOWED_ORIGINS")
    result = CliRunner().invoke(main, ["serve", "--allowed-origins", " , "])
    assert result.exit_code == 1, result.output
    assert "invalid setting allowed_origins" in result.output
