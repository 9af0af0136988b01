"""Per-client limits: the token bucket of each client (run starts, the run list). Its
bounds (clients remembered, a positive rate) are tested through the run starts' limit
in tests/reliability/test_run_limits.py."""

from __future__ import annotations

import pytest

from broadcaster.limits import ClientBuckets
from tests.support.factories import Seconds


def test_a_client_spends_its_burst_then_its_rate_and_is_told_how_long_to_wait() -> None:
    clock = Seconds()
    buckets = ClientBuckets(per_second=2, burst=3, clock=clock)
    assert [buckets.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("a") == pytest.approx(0.5)
    assert buckets.take("b") == 0.0, "another client has its own bucket"
    clock.now = 0.5
    assert buckets.take("a") == 0.0
    buckets.refund("a")
    assert buckets.take("a") == 0.0
