"""The conformance matrix on the Redis backend, for the kinds where backends could
differ (a nested run, a follow "until final", a session of runs): each produced once,
shown the same way by every surface (tests/support/conformance.py)."""

from __future__ import annotations

import pytest

from tests.support.conformance import Matrix, cells, check_cell, check_kind
from tests.support.matrix import KINDS

pytestmark = [pytest.mark.node, pytest.mark.browser, pytest.mark.redis, pytest.mark.timeout(300)]


@pytest.mark.parametrize("kind", [k.name for k in KINDS if "redis" in k.backends])
def test_the_kind_is_what_it_claims(redis_matrix: Matrix, kind: str) -> None:
    check_kind(redis_matrix, kind)


@pytest.mark.parametrize(("kind", "surface"), list(cells("redis")))
def test_every_surface_shows_the_run_as_the_channel_carried_it(
    redis_matrix: Matrix, kind: str, surface: str
) -> None:
    check_cell(redis_matrix, kind, surface)
