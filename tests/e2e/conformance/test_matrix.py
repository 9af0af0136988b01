"""The conformance matrix (tests/support/conformance.py): every kind of run, produced
once per backend, shown the same way by every surface. One class per backend, so that
pytest-xdist's ``--dist loadscope`` runs the two on different workers; Redis has the
kinds where backends could differ (a nested run, a follow "until final", a session of
runs)."""

from __future__ import annotations

import pytest

from tests.support.conformance import Matrix, cells, check_cell, check_kind
from tests.support.matrix import KINDS

pytestmark = [pytest.mark.node, pytest.mark.browser, pytest.mark.timeout(300)]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    backend = metafunc.cls.backend if metafunc.cls is not None else None
    if backend is None:
        return
    if "surface" in metafunc.fixturenames:
        metafunc.parametrize(("kind", "surface"), list(cells(backend)))
    elif "kind" in metafunc.fixturenames:
        metafunc.parametrize("kind", [k.name for k in KINDS if backend in k.backends])


@pytest.fixture
def matrix(request: pytest.FixtureRequest) -> Matrix:
    """The class's backend's matrix (a module fixture: produced once)."""
    found: Matrix = request.getfixturevalue(f"{request.cls.backend}_matrix")
    return found


class TestMemory:
    backend = "memory"

    def test_the_kind_is_what_it_claims(self, matrix: Matrix, kind: str) -> None:
        check_kind(matrix, kind)

    def test_every_surface_shows_the_run_as_the_channel_carried_it(
        self, matrix: Matrix, kind: str, surface: str
    ) -> None:
        check_cell(matrix, kind, surface)


@pytest.mark.redis
class TestRedis(TestMemory):
    backend = "redis"
