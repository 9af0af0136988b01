"""The ``nodes`` scenarios at their smallest: connections over 4 server nodes on one
Redis and on Redis Cluster, a shared and a private channel each, every broadcast and
every private publication counted.

No timing is asserted here; the figures come from ``scripts/bench``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.processes import REPO, require_bench_packages

pytestmark = [pytest.mark.node, pytest.mark.redis]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_smallest_nodes_runs_deliver_every_broadcast_and_private_message() -> None:
    """200 connections over 4 nodes, ours and socket.io's, over one Redis and a 3-primary
    cluster: every connection subscribed to the shared and its private channel (signed),
    every broadcast reached every client once, every private publication its owner only,
    no close, no slow-consumer cut, and the report checks the scenario's targets."""
    require_bench_packages()
    argv = [sys.executable, "-m", "bench", "--quick", "--scenarios", "nodes,nodes-cluster"]
    argv += ["--servers", "socketio,broadcaster", "--nodes-connections", "200", "--no-save"]
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=230, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    results = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    runs = [(r["server"], r["scenario"]) for r in results]
    assert runs == [
        ("socketio", "nodes"),
        ("broadcaster", "nodes"),
        ("socketio", "nodes-cluster"),
        ("broadcaster", "nodes-cluster"),
    ], run.stdout
    for result in results:
        assert result["nodes"] == 4
        assert result["connections"] == 200
        assert result["connect_failed"] == result["subscribe_failed"] == 0
        assert result["delivered"] == result["expected"] == 200 * result["broadcasts"]
        assert result["lost"] == result["duplicates"] == result["wrong_channel"] == 0
        assert result["private_delivered"] == 200
        assert result["unexpected_closes"] == 0
        assert result["latency_ms"]["n"] == result["delivered"]
        assert len(result["until_all_ms"]) == result["broadcasts"]
        for key in ("server_cpu_us_per_msg", "rss_kb_per_conn", "connect_per_s"):
            assert key in result
    ours = [r for r in results if r["server"] == "broadcaster"]
    assert [r["slow_consumer_cuts"] for r in ours] == [0, 0]  # read from every node's /metrics
    assert "(33) 200 connections over 4 nodes, one Redis" in run.stdout
    assert "(33) 200 connections over 4 nodes, Redis Cluster" in run.stdout
    assert "== nodes-cluster" in run.stdout
