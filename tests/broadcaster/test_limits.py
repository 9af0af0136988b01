"""Per-client limits: the token bucket of each client (run starts, the run list)."""

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


def test_at_most_max_clients_are_remembered() -> None:
    clock = Seconds()
    buckets = ClientBuckets(per_second=1, burst=2, max_clients=10, clock=clock)
    for n in range(100):
        buckets.take(f"c{n}")
    assert len(buckets) <= 10


@pytest.mark.parametrize(("rate", "burst"), [(0, 1), (1, 0), (-1, 1)])
def test_a_rate_and_a_burst_must_be_positive(rate: float, burst: int) -> None:
    with pytest.raises(ValueError, match="need a rate > 0"):
        ClientBuckets(per_second=rate, burst=burst)
