"""The bench harness counts what it measures: its smallest run loses nothing on loopback.

No timing is asserted here; the figures themselves come from ``scripts/bench``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from bench.agents import emitter_packet
from bench.envelope import ENVELOPE_BYTES, envelope
from bench.shards import run_shards
from broadcaster.envelope import StreamChunk, parse_envelope
from tests.support.processes import REPO, require_bench_packages

pytestmark = [pytest.mark.node, pytest.mark.redis]


def test_python_and_node_build_the_same_valid_300_byte_envelope() -> None:
    require_bench_packages()
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
    require_bench_packages()
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


def test_agent_publisher_builds_the_packet_socketio_redis_emitter_builds() -> None:
    """The socket.io reference's agent traffic is what ``@socket.io/redis-emitter``
    publishes: the same MessagePack bytes, long data included."""
    require_bench_packages()
    data = "x" * 300 + "é"
    script = (
        "const notepack = require('notepack.io');"
        "const packet = {type: 2, data: ['agent.stream.chunk', process.argv[1]], nsp: '/'};"
        "const opts = {rooms: ['agent.s-1'], flags: {}, except: []};"
        "process.stdout.write(notepack.encode(['emitter', packet, opts]).toString('hex'));"
    )
    node = subprocess.run(
        ["node", "-e", script, data],
        cwd=REPO / "bench" / "node",
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    ours = emitter_packet("agent.s-1", "agent.stream.chunk", data)
    assert ours.hex() == node.stdout


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_smallest_channels_idle_and_agents_runs_count_every_delivery() -> None:
    """Tiny runs of the paced 'channels', 'idle' and 'agents' scenarios on our server:
    every publication delivered once, in order, with history on; real agent sessions'
    envelopes all reach their 1-3 viewers."""
    require_bench_packages()
    argv = [sys.executable, "-m", "bench", "--scenarios", "channels,idle,agents"]
    argv += ["--servers", "broadcaster", "--channels", "20", "--channels-rate", "200"]
    argv += ["--duration", "1", "--idle", "50", "--agent-sessions", "3"]
    argv += ["--agent-duration", "1", "--no-save"]
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=110, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    results = {
        r["scenario"]: r
        for r in (json.loads(line) for line in run.stdout.splitlines() if line.startswith("{"))
    }
    channels, idle, agents = results["channels"], results["idle"], results["agents"]
    assert (channels["published"], channels["delivered"], channels["lost"]) == (200, 200, 0)
    assert channels["out_of_order"] == channels["wrong_channel"] == 0
    assert channels["history_len"] == 10  # 200 round robin over 20 channels
    assert channels["publish_rate"] == 200
    assert (idle["connections"], idle["subscribe_failed"], idle["unexpected_closes"]) == (50, 0, 0)
    [step] = agents["steps"]
    assert (step["sessions"], step["viewers"]) == (3, 6)  # 1, 2 and 3 viewers
    assert step["chunks"] > 0
    assert step["envelopes"] > step["chunks"]  # statuses, steps and tools too
    assert step["delivered"] > 0
    assert step["publish_side_ms"]["n"] > 0  # the bench read chunks off Redis itself
    assert step["lost"] == step["out_of_order"] == step["wrong_channel"] == step["dropped"] == 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_quick_http_run_measures_the_bare_uvicorn_reference_and_checks_issue_17() -> None:
    """The bare-uvicorn reference takes the same signed requests (every one answered 200,
    nothing delivered) and the report checks the HTTP targets against it."""
    require_bench_packages()
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


@pytest.mark.timeout(60)
def test_smallest_shards_run_delivers_every_publication_through_3_shards() -> None:
    """bench/shards.py over a 3-primary cluster and 2 server nodes, one step of 1 s at
    300/s on 8 channels: every publication reaches both nodes' clients, none lost."""
    require_bench_packages()
    sizes = SimpleNamespace(channels=8, seconds=1.0, rates=(300,))
    result = asyncio.run(run_shards(3, sizes))
    (step,) = result["steps"]
    assert step["subscribe_failed"] == 0
    assert step["unexpected_closes"] == 0
    assert step["lost"] == 0
    assert step["delivered"] == 2 * step["published"] == 600
    # Whether 300/s was under the p99 bound (the capacity) depends on the machine's load:
    # a timing, so only that the figure is reported is checked here.
    assert "capacity" in result


async def test_the_run_index_bench_lists_what_it_indexed() -> None:
    """``scripts/bench --run-index`` at its smallest: every page it times is full."""
    from bench.run_index import measure

    result = await measure("memory://", runs=300, requests=3)
    assert result["first_page_runs"] == 50
    assert result["failed_first_page_runs"] == 30  # one run in ten failed
    assert result["q_first_page_runs"] == 3  # one in a hundred


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_smallest_agentside_run_counts_both_sides_in_redis_history() -> None:
    """A tiny 'agentside' run: the product's sessions and the bench's own publisher both
    report their figures, and every envelope either side published is in its channel's
    Redis history (nothing lost, nothing dropped)."""
    require_bench_packages()
    argv = [sys.executable, "-m", "bench", "--scenarios", "agentside", "--servers", "broadcaster"]
    argv += ["--agentside-sessions", "3", "--agentside-duration", "1", "--no-save"]
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=110, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    results = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert [r["scenario"] for r in results] == ["agentside"], run.stdout
    result = results[0]
    for key in ("cpu_us_per_envelope", "floor_cpu_us_per_envelope", "floor_ratio"):
        assert result[key] is not None, key
    assert result["sessions_per_worker_core"] is not None
    assert result["lost"] == 0
    for side in ("product", "floor"):
        figures = result[side]
        assert figures["sessions"] == 3
        assert figures["envelopes"] > 3 * 5  # status, step, chunks, tool, status per session
        assert figures["in_history"] == figures["envelopes"]
        assert figures["lost"] == 0
    # The floor replays a product session: as many envelopes per session as it had.
    assert result["floor"]["envelopes"] % 3 == 0
    assert "(33) agent side: every envelope in its channel's history" in run.stdout
