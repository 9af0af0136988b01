"""broadcaster.sessions, the I/O-free parts (the routes are tested on real servers in
tests/e2e/server/test_run_index_api.py)."""

from __future__ import annotations

import orjson

from broadcaster.run_index import RunSummary
from broadcaster.sessions import _mark_abandoned


def rows(*statuses: str) -> list[bytes]:
    return [
        RunSummary("s", f"x-{i}", float(i), status=status).to_json()  # type: ignore[arg-type]
        for i, status in enumerate(statuses)
    ]


def marked(found: list[bytes]) -> list[bool]:
    return [orjson.loads(raw).get("abandoned", False) for raw in found]


def test_an_earlier_running_row_is_abandoned_and_the_latest_only_when_nothing_runs_it() -> None:
    found = rows("running", "completed", "running")
    assert marked(_mark_abandoned(found, active=True)) == [True, False, False]
    assert marked(_mark_abandoned(found, active=False)) == [True, False, True]


def test_ended_rows_are_left_as_stored_and_a_marked_row_is_still_a_summary() -> None:
    found = rows("completed", "failed", "running")
    out = _mark_abandoned(found, active=False)
    assert out[:2] == found[:2]
    assert RunSummary.from_json(out[2]) == RunSummary.from_json(found[2])
