"""The TypeScript client kit (clients/js): ``tsc --noEmit`` and its own tests (node's
test runner: the reducer, generated types against the schema, watchSession and
watchSessionSse following real runs on a real server, the React hook under jsdom)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.processes import REPO, require_binary

pytestmark = [pytest.mark.node, pytest.mark.slow]

KIT = REPO / "clients" / "js"


def npm(*args: str) -> subprocess.CompletedProcess[str]:
    binary = require_binary("npm")
    if not (KIT / "node_modules" / "typescript").is_dir():
        pytest.fail("clients/js has no node_modules: run scripts/install --test")
    env = {**os.environ, "BROADCASTER_PYTHON": sys.executable}
    return subprocess.run(
        [binary, *args], cwd=KIT, env=env, capture_output=True, text=True, timeout=240
    )


def test_the_typescript_sources_type_check_under_strict() -> None:
    done = npm("run", "--silent", "typecheck")
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.timeout(300)
def test_the_client_kit_tests_pass() -> None:
    done = npm("test", "--silent")
    assert done.returncode == 0, done.stdout[-20000:] + done.stderr[-5000:]
    assert "# fail 0" in done.stdout
    assert "# skipped 0" in done.stdout
