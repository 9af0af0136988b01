"""README command 1 on a fresh clone (issue 38): ``./scripts/demo`` exactly as written,
in a clone of this checkout's HEAD, installs the runtime alone (no extra) into the
clone's own ``.venv`` and serves the demo: ``/ready`` answers, a run completes through
``POST /run`` with ``wait``, and SIGTERM stops it cleanly.

The command is the README's own line (read from README.md, so the two cannot drift);
only its port comes from the environment (``BROADCASTER_PORT=0``: a free one, printed in
the banner). The clone has its own environment, so the extras that scripts/test installs
into this checkout's ``.venv`` cannot hide a missing import there, whatever the order of
the tests. What is tested is HEAD: uncommitted changes are not in the clone.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support.processes import REPO, ServerProcess
from tests.support.runs import complete_demo_run

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

INSTALL_SECONDS = 600
"""The runtime install from a cold pip cache, on a loaded 2-core machine."""


def readme_command_1() -> list[str]:
    """The README's "1." command of the set-up, without its comment."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.search(r"^(\S[^#\n]*?)\s+# 1\. ", readme, re.M)
    assert found, "README.md's set-up names command 1"
    return found.group(1).split()


def fresh_clone(into: Path) -> Path:
    head = _git("rev-parse", "HEAD", cwd=REPO)
    clone = into / "clone"
    _git("clone", "--quiet", "--no-checkout", str(REPO), str(clone), cwd=into)
    _git("checkout", "--quiet", "--detach", head, cwd=clone)
    assert not (clone / ".venv").exists()
    return clone


def _git(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"git {' '.join(args)}: {done.stderr}"
    return done.stdout.strip()


def plain_environment() -> dict[str, str]:
    """This environment without this checkout's virtual environment on the PATH."""
    venv = str(REPO / ".venv")
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if not p.startswith(venv)]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, "PATH": os.pathsep.join(path), "BROADCASTER_PORT": "0"}


def test_readme_command_1_installs_the_runtime_and_serves_a_run(tmp_path: Path) -> None:
    command = readme_command_1()
    assert command == ["./scripts/demo"], command  # what the docstring says is tested
    clone = fresh_clone(tmp_path)
    demo = ServerProcess(env=plain_environment(), command=command, cwd=clone)
    try:
        demo.start(timeout=INSTALL_SECONDS)
        demo.wait_ready()
        answer = complete_demo_run(demo.url)
        assert answer["output"] == "6 * 7 = 42.", answer
    finally:
        code = demo.stop()
    assert code in (0, -signal.SIGTERM), demo.log  # uvicorn re-raises the signal it handled
    assert "Finished server process" in demo.log, demo.log
    assert "agent-broadcaster backend: memory" in demo.log, demo.log
    assert "Traceback" not in demo.log, demo.log
    installed = subprocess.run(
        [str(clone / ".venv/bin/python"), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.lower()
    for extra_only in ("opentelemetry-sdk", "pydantic-ai-slim", "openai-agents", "langgraph"):
        assert f"{extra_only}==" not in installed, f"the runtime install has {extra_only}"
