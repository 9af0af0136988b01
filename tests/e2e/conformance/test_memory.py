"""The conformance matrix on the in-memory backend: every kind of run, produced once,
shown the same way by every surface (tests/support/conformance.py)."""

from __future__ import annotations

import pytest

from tests.support.conformance import Matrix, cells, check_cell, check_kind
from tests.support.matrix import KINDS

pytestmark = [pytest.mark.node, pytest.mark.browser, pytest.mark.timeout(300)]


@pytest.mark.parametrize("kind", [k.name for k in KINDS if "memory" in k.backends])
def test_the_kind_is_what_it_claims(memory_matrix: Matrix, kind: str) -> None:
    check_kind(memory_matrix, kind)


@pytest.mark.parametrize(("kind", "surface"), list(cells("memory")))
def test_every_surface_shows_the_run_as_the_channel_carried_it(
    memory_matrix: Matrix, kind: str, surface: str
) -> None:
    check_cell(memory_matrix, kind, surface)
