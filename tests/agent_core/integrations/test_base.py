"""The framework adapters' common run (agent_core/integrations/_base.py)."""

from __future__ import annotations

from agent_core.integrations._base import _later


def state(updated_at: str) -> dict[str, object]:
    return {"status": "completed", "execution": {"updated_at": updated_at, "x": 1}}


def test_a_state_stored_again_is_a_later_version_even_within_the_same_millisecond() -> None:
    first = state("2026-01-16T10:05:00.123Z")
    assert _later(state("2026-01-16T10:05:00.200Z"), first) == state("2026-01-16T10:05:00.200Z")
    moved = _later(state("2026-01-16T10:05:00.123Z"), first)
    assert moved == state("2026-01-16T10:05:00.124Z")
