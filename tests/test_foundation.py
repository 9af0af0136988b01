"""The foundation: CLI entry points, settings validation, the server process, the
Procfile and the test fixtures themselves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from broadcaster.settings import SettingsError, load_settings
from tests.support.processes import (
    REPO,
    RedisServer,
    ServerFactory,
    ServerProcess,
    _wait,
    free_port,
)

VENV_BIN = Path(sys.executable).parent


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broadcaster", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.mark.io
def test_module_and_console_script_share_the_cli() -> None:
    via_module = run_cli("serve", "--help")
    via_script = subprocess.run(
        [str(VENV_BIN / "agent-broadcaster"), "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert via_module.returncode == via_script.returncode == 0
    assert "--backend" in via_module.stdout
    assert via_module.stdout.split("\n", 1)[1] == via_script.stdout.split("\n", 1)[1]


@pytest.mark.io
@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--port", "70000"], {}, "port=70000"),
        (["--backend", "kafka://x"], {}, "backend='kafka://x'"),
        ([], {"BROADCASTER_PORT": "nope"}, "port='nope'"),
        ([], {"BROADCASTER_LOG_LEVEL": "loud"}, "log_level='loud'"),
    ],
)
def test_invalid_settings_stop_startup_naming_the_value(
    args: list[str], env: dict[str, str], named: str
) -> None:
    result = run_cli("serve", *args, env=env)
    assert result.returncode != 0
    assert named in result.stderr, result.stderr


def test_apps_file_lists_several_apps(tmp_path: Path) -> None:
    path = tmp_path / "apps.toml"
    path.write_text(
        '[[apps]]\nid = "a"\nkey = "ka"\nsecret = "sa"\n'
        '[[apps]]\nid = "b"\nkey = "kb"\nsecret = "sb"\nenable_client_messages = true\n'
    )
    apps = load_settings(apps_file=path).apps()
    assert [a.id for a in apps] == ["a", "b"]
    assert apps[1].enable_client_messages
    assert not apps[0].enable_client_messages


def test_apps_file_rejects_duplicate_keys(tmp_path: Path) -> None:
    path = tmp_path / "apps.json"
    apps = [{"id": "a", "key": "k", "secret": "s"}, {"id": "b", "key": "k", "secret": "t"}]
    path.write_text(json.dumps({"apps": apps}))
    with pytest.raises(SettingsError, match="duplicate app key"):
        load_settings(apps_file=path)


def test_secret_is_not_echoed_in_errors() -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(app_secret="")
    assert "app_secret=<hidden>" in str(info.value)


@pytest.mark.io
def test_demo_server_serves_the_dashboard_at_the_printed_url(server_factory: ServerFactory) -> None:
    server = server_factory("--demo")
    page = httpx.get(f"{server.url}/", timeout=5)
    assert page.status_code == 200
    assert "text/html" in page.headers["content-type"]
    assert "<title>" in page.text
    assert httpx.get(f"{server.url}/up", timeout=5).json() == {"status": "up"}
    assert "Open the demo dashboard: http://" in server.log


@pytest.mark.io
def test_sigterm_shuts_down_cleanly(server: ServerProcess) -> None:
    # uvicorn re-raises the captured signal once its graceful shutdown is done.
    assert server.stop() in (0, -signal.SIGTERM)
    assert "Finished server process" in server.log


@pytest.mark.io
def test_redis_fixture_can_be_killed_and_restarted(
    redis_factory: Callable[[], RedisServer],
) -> None:
    redis = redis_factory()
    assert redis.ping()
    redis.kill()
    assert not redis.ping()
    redis.start()
    assert redis.ping()


@pytest.mark.io
def test_procfile_web_and_worker_run_an_agent_under_honcho(redis_server: RedisServer) -> None:
    """The scaled-out shape: web queues the run, worker executes it through Redis."""
    port = free_port()
    env = {**os.environ, "PORT": str(port), "REDIS_URL": redis_server.url}
    proc = subprocess.Popen(
        [str(VENV_BIN / "honcho"), "start"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:

        def up() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/up", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        _wait(up, 30, "the Procfile's web process")
        base = f"http://127.0.0.1:{port}"
        run = httpx.post(f"{base}/run", json={"input": "Weather in Oslo?"}, timeout=5)
        assert run.status_code == 202, run.text

        def reconciled() -> bool:
            state = httpx.get(f"{base}{run.json()['state_url']}", timeout=2)
            return state.status_code == 200 and state.json()["status"] == "completed"

        _wait(reconciled, 30, "the worker to finish the run")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)


@pytest.mark.io
def test_broadcaster_never_imports_agent_core() -> None:
    """The dependency points one way (docs/development.md, style guide): agent_core
    may use the broadcaster's client-side pieces; the server reaches the demo only
    through an entry point."""
    code = (
        "import pkgutil, importlib, sys, broadcaster\n"
        "for m in pkgutil.walk_packages(broadcaster.__path__, 'broadcaster.'):\n"
        "    if m.name != 'broadcaster.__main__':\n"
        "        importlib.import_module(m.name)\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] == 'agent_core'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"
