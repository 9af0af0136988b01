"""``scripts/bench --list-pollers`` runs its three phases and counts what it measures (no
timing is asserted: the figure is in docs/performance.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.processes import REPO

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.mark.timeout(120)
def test_the_smallest_list_pollers_run_measures_up_in_three_phases() -> None:
    argv = [sys.executable, "-m", "bench", "--list-pollers"]
    argv += ["--runs", "300", "--pollers", "2", "--seconds", "1"]
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=110, check=False)
    assert run.returncode in (0, 1), run.stdout + run.stderr  # 1: the target missed
    [line] = [line for line in run.stdout.splitlines() if line.startswith("{")]
    result = json.loads(line)
    for phase in ("alone", "with pollers", "with pollers, no rate limit"):
        assert result[phase]["samples"] > 10, result
        assert result[phase]["up_ms"]["p95"] >= result[phase]["up_ms"]["median"] > 0
    assert "list_answers_per_s" not in result["alone"]
    assert set(result["with pollers"]["list_answers_per_s"]) <= {"200", "429"}
    assert set(result["with pollers, no rate limit"]["list_answers_per_s"]) == {"200"}
    assert "target < 50 ms" in run.stdout
