"""The command line's help tells the defaults the code uses."""

from __future__ import annotations

from click.testing import CliRunner

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
