"""bench/callgrind_channels.py's measured workload runs and delivers every message on
each path (without valgrind: the counting itself is for scripts, minutes long)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.processes import REPO


@pytest.mark.timeout(120)
@pytest.mark.parametrize("path", ["full", "python", "compiled"])
def test_the_channels_workload_delivers_every_message_on_each_path(path: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.callgrind_channels", "--run", path, "400"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    # It exits non-zero when fewer messages were delivered than fed (or, for the
    # compiled path, when the C definition is not built).
    assert done.returncode == 0, done.stderr[-2000:]
