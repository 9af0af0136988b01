"""Failover under two server processes: SIGKILL the Redis Cluster primary that owns the
channel's slot (its replica is promoted), or the primary Sentinel names, mid-stream.

Both nodes stay up and keep their clients connected, ``/ready`` goes 503 during the
outage and 200 after, subscriptions come back without client action, and every
publication a publisher was told was accepted (HTTP 200) reaches every live client, or a
client resuming across the failover is told ``recovered: false``: never a silent gap
(see tests/reliability/failover.py for the accounting; ``scripts/failover-trials``
repeats it for the figures in docs/reliability.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict

import pytest

from tests.reliability.failover import (
    SERVE_ARGS,
    ClusterFaults,
    Faults,
    SentinelFaults,
    failover_trial,
)
from tests.reliability.helpers import report
from tests.support.processes import ServerFactory
from tests.support.topologies import ClusterTopology, SentinelTopology

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture(params=["cluster", "sentinel"])
def faults(request: pytest.FixtureRequest) -> Iterator[Faults]:
    """A topology of the test's own (it loses a primary)."""
    if request.param == "cluster":
        cluster = ClusterTopology().start()
        yield ClusterFaults(cluster)
        cluster.stop()
    else:
        sentinel = SentinelTopology().start()
        yield SentinelFaults(sentinel)
        sentinel.stop()


async def test_no_silent_gap_when_the_primary_is_killed(
    faults: Faults, server_factory: ServerFactory, request: pytest.FixtureRequest
) -> None:
    name = request.node.callspec.params["faults"]
    nodes = [server_factory("--backend", faults.url, *SERVE_ARGS) for _ in range(2)]
    for node in nodes:
        node.wait_ready()

    trial = await failover_trial(faults, nodes, "agent.failover", name)

    assert trial.silent_gaps == []
    assert trial.live_clients == 4
    assert trial.accepted > trial.accepted_before_kill + 60  # publishing went on after it
    assert trial.resumed_recovered is not None
    # A resume across the failover may be recovered only when nothing was lost.
    assert not (trial.lost_by_replication and trial.resumed_recovered)
    report(f"redis_failover_{name}", **asdict(trial))
