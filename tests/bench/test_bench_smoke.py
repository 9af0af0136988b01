"""The bench harness counts what it measures: its smallest run loses nothing on loopback.

No timing is asserted here; the figures themselves come from ``scripts/bench``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.envelope import ENVELOPE_BYTES, envelope
from broadcaster.envelope import StreamChunk, parse_envelope
from tests.support.processes import IN_CI, REPO, require_binary

pytestmark = [pytest.mark.node, pytest.mark.redis]


def _require_bench_packages() -> None:
    require_binary("node")
    require_binary("redis-server")
    if not (REPO / "bench" / "node" / "node_modules").is_dir():
        message = "bench/node/node_modules is missing (scripts/install --test installs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


def test_python_and_node_build_the_same_valid_300_byte_envelope() -> None:
    _require_bench_packages()
    text = envelope("bench-3", 42, ts_micros=1_700_000_000_123_456)
    script = (
        "process.stdout.write(require('./envelope.js').envelope('bench-3', 42, 1700000000123456))"
    )
    node = subprocess.run(
        ["node", "-e", script],
        cwd=REPO / "bench" / "node",
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    assert node.stdout == text
    assert len(text.encode()) == ENVELOPE_BYTES
    parsed = parse_envelope(text)
    assert isinstance(parsed, StreamChunk)
    assert parsed.payload.chunk_index == 42


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_smallest_fanout_run_delivers_every_message_to_every_client() -> None:
    """5 clients, 200 publications, the plain-websockets reference and our server: each
    run reports 1,000 deliveries, none lost, reordered or on the wrong channel."""
    _require_bench_packages()
    argv = [sys.executable, "-m", "bench", "--scenarios", "fanout"]
    argv += ["--servers", "websockets,broadcaster", "--clients", "5", "--messages", "200"]
    run = subprocess.run(
        [*argv, "--no-save"], cwd=REPO, capture_output=True, text=True, timeout=110, check=False
    )
    assert run.returncode == 0, run.stdout + run.stderr
    results = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert [r["server"] for r in results] == ["websockets", "broadcaster"], run.stdout
    for result in results:
        assert result["published"] == 200
        assert result["delivered"] == 1000
        assert result["lost"] == 0
        assert result["out_of_order"] == 0
        assert result["wrong_channel"] == 0
        assert result["unexpected_closes"] == 0
    assert "(d) no lost or reordered message in any scenario" in run.stdout


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_quick_http_run_measures_the_bare_uvicorn_reference_and_checks_issue_17() -> None:
    """The bare-uvicorn reference takes the same signed requests (every one answered 200,
    nothing delivered) and the report checks the HTTP targets against it."""
    _require_bench_packages()
    argv = [sys.executable, "-m", "bench", "--quick", "--scenarios", "http"]
    argv += ["--servers", "uvicorn,broadcaster", "--no-save"]
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=110, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    results = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert [r["server"] for r in results] == ["uvicorn", "broadcaster"], run.stdout
    reference, ours = results
    assert reference["single_requests"] > 0
    assert reference["single_delivered"] is None
    assert ours["single_delivered"] == ours["single_events"]
    assert ours["batch_delivered"] == ours["batch_events"]
    assert ours["lost"] == 0
    assert ours["out_of_order"] == 0
    assert "x uvicorn" in run.stdout
    assert "(e) signed HTTP publish CPU per request <= 2x a bare uvicorn endpoint:" in run.stdout
    assert "(e) HTTP batch of 10: server CPU per event <= 40 us:" in run.stdout
